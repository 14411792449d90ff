"""A bound kernel launch's argument block (targets/gpu/cuda.py ``BoundLaunch``), checked without a GPU:
``cuLaunchKernel`` reads each parameter's bytes at the address its ``kernelParams`` entry gives (8 for a
pointer or a 64-bit size, 4 for a 32-bit one), so those addresses must hold exactly what was bound."""

from __future__ import annotations

import ctypes

import pytest

from migraphx_ep.targets.gpu import cuda


class FakeKernel:
    name = "k_test"

    def __init__(self) -> None:
        self.shared: list[int] = []

    def set_shared(self, nbytes: int) -> None:
        self.shared.append(nbytes)


def _params(launch: cuda.BoundLaunch, n: int) -> list[int]:
    argv = ctypes.cast(ctypes.addressof(launch._argv), ctypes.POINTER(ctypes.c_void_p))
    return [argv[i] for i in range(n)]


@pytest.mark.parametrize("bits", [32, 64])
def test_every_argument_is_where_its_parameter_points(bits):
    pointers = [0x7F12_3456_7000, 0x10, 0xFFFF_FFFF_FFFF_FF00]
    scalars = [5, (1 << 32) + 7, 0, (1 << 31) + 1]
    k = FakeKernel()
    launch = cuda.BoundLaunch(k, (3, 2, 1), (128, 1, 1), 4096, pointers, scalars=scalars, scalar_bits=bits)
    at = _params(launch, len(pointers) + len(scalars))
    assert len(set(at)) == len(at)  # one slot each
    assert [ctypes.c_uint64.from_address(a).value for a in at[: len(pointers)]] == pointers
    scalar = ctypes.c_uint64 if bits == 64 else ctypes.c_uint32
    want = [scalar(v).value for v in scalars]  # what the per-argument ctypes objects held before
    assert [scalar.from_address(a).value for a in at[len(pointers) :]] == want
    assert launch.pointers == tuple(pointers) and launch.grid == (3, 2, 1) and k.shared == [4096]


def test_a_launch_without_arguments_still_has_a_block():
    launch = cuda.BoundLaunch(FakeKernel(), (1, 1, 1), (32, 1, 1), 0, [])
    assert ctypes.sizeof(launch._argv) >= ctypes.sizeof(ctypes.c_void_p)
    assert launch.pointers == ()
