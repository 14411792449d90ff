"""Device-side error flags: how a kernel reports an input the ref target rejects (an index out of range,
an integer zero divisor) without a synchronisation or a copy of its own.

Every kernel with checks (``KernelSpec.checks``) gets one int32 slot in a small mapped (zero-copy)
host buffer allocated once per executable, so the addresses bound into its launches, and into the
captured CUDA graph, never change. A failing check stores its code in the slot and the kernel skips the
element; nothing is written otherwise. ``Run`` looks at the slots after the synchronisation it makes
anyway (no copy: about 0.1 us), and a set slot is cleared and raised as the exception the ref raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...ops.gqa import GqaPresentAssumed, GqaRunError
from . import cuda
from .kernels.spec import KernelSpec

_ERRORS: dict[str, type[Exception]] = {
    "IndexError": IndexError,
    "ZeroDivisionError": ZeroDivisionError,
    "ValueError": ValueError,  # roi_align: a roi that is not finite
    "GqaRunError": GqaRunError,
    "GqaPresentAssumed": GqaPresentAssumed,  # an AssumptionFailed: the EP recompiles
}


def device_error(spec: KernelSpec, code: int) -> Exception:
    """The exception for check ``code`` (1-based) that kernel ``spec`` reported."""
    if not 1 <= code <= len(spec.checks):
        return RuntimeError(f"gpu kernel {spec.name} reported an unknown error code {code}")
    check = spec.checks[code - 1]
    return _ERRORS.get(check.error, RuntimeError)(f"{check.message} (found by gpu kernel {spec.name})")


class DeviceErrors:
    """The error slots of one executable's checking kernels; ``mem`` is the ``cuda`` layer (tests fake
    it). Specs are told apart by identity: the lowered steps keep them alive as long as the executable."""

    def __init__(self, specs: Sequence[KernelSpec], mem: Any = cuda) -> None:
        self.mem = mem
        self.specs = [s for s in specs if s.checks]
        self._slot = {id(s): k for k, s in enumerate(self.specs)}
        n = len(self.specs)
        self.nbytes = 4 * n
        self._buffer = mem.MappedBuffer(self.nbytes) if n else None
        self.host = self._buffer.view(np.dtype(np.int32), (n,)) if self._buffer else np.zeros(0, np.int32)
        self._clear_bytes = bytes(self.nbytes)
        self.clear()  # fresh pinned memory may hold anything

    def pointer(self, spec: KernelSpec) -> int:
        """The device address of ``spec``'s slot (its launch's last argument)."""
        return self._buffer.device_ptr + 4 * self._slot[id(spec)]  # type: ignore[union-attr]

    def clear(self) -> None:
        """Only while no kernel runs (after a synchronisation): the host writes the slots directly."""
        self.host[:] = 0

    def raise_if_set(self) -> None:
        """After a Run's synchronisation: raise the first failure, if any, leaving every slot clear."""
        if self.host.tobytes() == self._clear_bytes:  # ~0.1 us; numpy's any() costs 2 us
            return
        k = int(np.flatnonzero(self.host)[0])
        err = device_error(self.specs[k], int(self.host[k]))
        self.clear()
        raise err
