"""Convolution on cuDNN's legacy (v7-style) API through ctypes: one plan per convolution, chosen once.

cuDNN 9 still ships that API (libcudnn_cnn). Tensors are described with explicit strides, so x, y and
z go in whatever layout they have (NCHW, NHWC, padded rows); filters take a format instead of strides,
so weights must be packed KCRS or KRSC. A 1-d convolution is a 2-d one over (L, 1).

``y = relu?(conv(x, w) + z? + bias?)`` is one cudnnConvolutionBiasActivationForward where cuDNN takes
it: that call needs a bias, and allows an identity activation only with IMPLICIT_PRECOMP_GEMM
(``_fusable``); a trial run at plan time confirms it. Otherwise cudnnConvolutionForward is followed by
cudnnAddTensor (z, bias) and cudnnActivationForward, in place on y.

Enum values carry the C names from cudnn_graph.h / cudnn_ops.h / cudnn_cnn.h on purpose:
``tools/check_gpu_constants.py`` compares every one with the real headers.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Sequence

from ...ir.dtypes import DType
from ...ir.shape import Shape
from . import libs
from .kernels.spec import Unsupported
from .libs import FwdAlgoPerf
from .tuning import keep_pick, restore_pick

CUDNN_STATUS_SUCCESS = 0
CUDNN_STATUS_NOT_SUPPORTED = 3000
CUDNN_DATA_FLOAT = 0
CUDNN_DATA_DOUBLE = 1
CUDNN_DATA_HALF = 2
CUDNN_DATA_BFLOAT16 = 9
CUDNN_TENSOR_NCHW = 0
CUDNN_TENSOR_NHWC = 1
CUDNN_CROSS_CORRELATION = 1
CUDNN_DEFAULT_MATH = 0
CUDNN_TENSOR_OP_MATH = 1
CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2
CUDNN_FMA_MATH = 3
CUDNN_ACTIVATION_RELU = 1
CUDNN_ACTIVATION_IDENTITY = 5
CUDNN_PROPAGATE_NAN = 1
CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1
CUDNN_CONVOLUTION_FWD_ALGO_FFT = 4
CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING = 5
CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD = 6
CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED = 7
CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8
# Transform-domain algorithms round through FFT/Winograd tiles: an output that is exactly 0 comes back
# as ~1e-5 (ONNX's ConvTranspose group case failed atol 1e-7). Not taken where full fp32 is asked for.
_TRANSFORM_ALGOS = frozenset(
    {
        CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
    }
)

INT_MAX = 2**31 - 1
_P = ctypes.c_void_p
# IR type -> (cuDNN data type, convolution compute type, host type of alpha/beta, math type wanted)
_TYPES = {
    DType.float_type: (CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, ctypes.c_float, CUDNN_FMA_MATH),
    DType.half_type: (CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, ctypes.c_float, CUDNN_TENSOR_OP_MATH),
    DType.bf16_type: (CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, ctypes.c_float, CUDNN_TENSOR_OP_MATH),
    DType.double_type: (CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, ctypes.c_double, CUDNN_DEFAULT_MATH),
}


class DnnError(RuntimeError):
    """A cuDNN call failed; the message names the call, cuDNN's status string and the convolution."""


def lib() -> ctypes.CDLL:
    return libs.cudnn()


def status_string(status: int) -> str:
    try:
        s = lib().cudnnGetErrorString(status)
        return s.decode() if s else f"cuDNN status {status}"
    except Exception:  # noqa: BLE001 - naming an error must not raise another
        return f"cuDNN status {status}"


def version() -> int:
    return int(lib().cudnnGetVersion())


def _create_handle() -> int:
    p = _P()
    st = lib().cudnnCreate(ctypes.byref(p))
    if st != CUDNN_STATUS_SUCCESS:
        raise DnnError(f"cudnnCreate failed: {status_string(st)} ({st})")
    return int(p.value or 0)


_HANDLES = libs.HandlePool(_create_handle)


def borrow_handle() -> contextlib.AbstractContextManager[int]:
    """A cuDNN handle of the current device that no other caller uses until the block ends."""
    return _HANDLES.borrow()


def _ints(values: Sequence[int]) -> ctypes.Array:
    return (ctypes.c_int * len(values))(*values)


def tensor_strides(s: Shape) -> tuple[int, ...]:
    """``s``'s strides as cuDNN takes them, all positive: a unit axis with stride 0 gets the stride that
    makes it outermost, which addresses the same elements. A broadcast axis cannot be described."""
    if any(st <= 0 and n > 1 for st, n in zip(s.strides, s.lens, strict=True)):
        raise Unsupported(f"cuDNN convolution: tensor {s} is broadcast or has a negative stride")
    outer = max(max((st * n for st, n in zip(s.strides, s.lens, strict=True)), default=1), 1)
    return tuple(st if st > 0 else outer for st in s.strides)


def _packed_in_order(s: Shape, order: Sequence[int]) -> bool:
    """Whether ``s`` is packed with its axes nested as ``order`` (outermost first); unit axes skipped."""
    expect = 1
    for axis in reversed(order):
        if s.lens[axis] != 1 and s.strides[axis] != expect:
            return False
        expect *= s.lens[axis]
    return True


def filter_format(w: Shape) -> int:
    """NCHW for packed KCRS weights, NHWC for packed KRSC; anything else cannot be described."""
    if _packed_in_order(w, range(w.ndim())):
        return CUDNN_TENSOR_NCHW
    if _packed_in_order(w, [0, *range(2, w.ndim()), 1]):
        return CUDNN_TENSOR_NHWC
    raise Unsupported(f"cuDNN convolution: weights {w} are neither packed KCRS nor packed KRSC")


def is_channels_last(s: Shape) -> bool:
    return s.lens[1] > 1 and s.strides[1] == 1 and min(s.strides[2:]) >= s.lens[1]


def expand_1d(s: Shape) -> Shape:
    """(N, C, L) as (N, C, L, 1); the new axis's stride equals L's, as in a packed layout with W = 1."""
    return Shape(s.type, (*s.lens, 1), (*s.strides, s.strides[-1]))


def output_lens(
    x: Shape, w: Shape, pads: Sequence[int], strides: Sequence[int], dils: Sequence[int]
) -> tuple:
    spans = [(w.lens[2 + i] - 1) * dils[i] + 1 for i in range(x.ndim() - 2)]
    spatial = [
        (n + 2 * p - sp) // s + 1 for n, p, sp, s in zip(x.lens[2:], pads, spans, strides, strict=True)
    ]
    return (x.lens[0], w.lens[0], *spatial)


def _fusable(bias: bool, relu: bool, algo: int) -> bool:
    """cudnnConvolutionBiasActivationForward needs a bias; an identity activation works with one algo."""
    return bias and (relu or algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)


class ConvPlan:
    """A planned convolution: descriptors, algorithm, math type, fused or not; ``run`` enqueues it."""

    def __init__(self, dtype: DType, shapes: tuple[Shape, Shape, Shape, Shape], conv: tuple, bias: bool,
                 relu: bool, residual: bool, allow_tf32: bool) -> None:  # fmt: skip
        self.dtype, self.shapes, self.conv = DType(dtype), shapes, conv  # conv: pads, strides, dils, groups
        self.bias, self.relu, self.residual = bias, relu, residual
        self.data_type, compute, scalar, self.wanted_math = _TYPES[self.dtype]
        self.no_tf32 = self.dtype == DType.float_type and not allow_tf32
        if self.dtype == DType.float_type and allow_tf32:  # cuDNN's default math may use TF32
            self.wanted_math = CUDNN_DEFAULT_MATH
        self.one, self.zero = scalar(1.0), scalar(0.0)
        self.algo, self.math, self.fused, self.workspace_size = -1, self.wanted_math, False, 0
        # The device: what the pick memo keys picks by (tuning.py). Calls borrow a handle each
        # (borrow_handle): a cuDNN handle serves one thread at a time.
        self.handle = -1
        self._descs: list[tuple[str, int]] = []  # (destroy function, descriptor), freed by close()
        flags = f"{int(bias)}{int(relu)}{int(residual)}"
        self.key = f"{self.dtype.name}:{':'.join(map(repr, shapes))}:{conv}:{flags}:{self.wanted_math}"
        x, w, y, z = shapes
        # The layer at any input size (tuning.LayerPicks): all of the key but the input's spatial dims
        layouts = tuple(is_channels_last(t) for t in (x, y, z))
        self.layer = (self.dtype.name, repr(w), x.ndim(), layouts, conv, flags, self.wanted_math)
        pads, strides, dils, groups = conv
        if x.ndim() == 3:  # 1-d: a 2-d convolution over (L, 1)
            x, w, y, z = (expand_1d(t) for t in (x, w, y, z))
            pads, strides, dils = (*pads, 0), (*strides, 1), (*dils, 1)
        self.x_desc, self.y_desc = self._tensor(x), self._tensor(y)
        self.z_desc = self.y_desc if z == y else self._tensor(z)
        self.w_desc = self._create("Filter")
        self._call(
            "cudnnSetFilterNdDescriptor",
            self.w_desc,
            self.data_type,
            filter_format(w),
            w.ndim(),
            _ints(w.lens),
        )
        self.conv_desc = self._create("Convolution")
        geometry = (len(pads), _ints(pads), _ints(strides), _ints(dils), CUDNN_CROSS_CORRELATION, compute)
        self._call("cudnnSetConvolutionNdDescriptor", self.conv_desc, *geometry)
        self._call("cudnnSetConvolutionGroupCount", self.conv_desc, groups)
        self.set_math(self.wanted_math)
        self.bias_desc = 0
        if bias:  # [C_out] as 1 x C x 1 x 1, strided like y so channels-last engines take it
            c, k = y.lens[1], y.ndim() - 2
            inner = (c,) * k if is_channels_last(y) else (1,) * k
            self.bias_desc = self._tensor(Shape(y.type, (1, c) + (1,) * k, (c, 1, *inner)))
        self.act_desc = self._create("Activation")
        mode = CUDNN_ACTIVATION_RELU if relu else CUDNN_ACTIVATION_IDENTITY
        self._call("cudnnSetActivationDescriptor", self.act_desc, mode, CUDNN_PROPAGATE_NAN, 0.0)

    def describe(self) -> str:
        x, w, y, z = self.shapes
        pads, strides, dils, groups = self.conv
        extra = " +bias" * self.bias + " +residual" * self.residual + " +relu" * self.relu
        return (f"convolution {self.dtype.name} x={x} w={w} y={y} pads={list(pads)} strides={list(strides)} "
                f"dilations={list(dils)} groups={groups}{extra}")  # fmt: skip

    def _check(self, st: int, fn: str) -> None:
        if st != CUDNN_STATUS_SUCCESS:
            raise DnnError(f"{fn} failed: {status_string(st)} ({st}) for {self.describe()}")

    def _call(self, fn: str, *args: object) -> None:
        self._check(getattr(lib(), fn)(*args), fn)

    def _create(self, kind: str) -> int:
        p = _P()
        self._call(f"cudnnCreate{kind}Descriptor", ctypes.byref(p))
        self._descs.append((f"cudnnDestroy{kind}Descriptor", int(p.value or 0)))
        return int(p.value or 0)

    def _tensor(self, s: Shape) -> int:
        strides = tensor_strides(s)
        if max((*s.lens, *strides, s.element_space())) > INT_MAX:
            raise Unsupported(f"cuDNN convolution: tensor {s} exceeds 32-bit sizes")
        desc = self._create("Tensor")
        self._call(
            "cudnnSetTensorNdDescriptor", desc, self.data_type, s.ndim(), _ints(s.lens), _ints(strides)
        )
        return desc

    def set_math(self, math: int) -> None:
        self._call("cudnnSetConvolutionMathType", self.conv_desc, math)
        self.math = math

    def workspace(self, algo: int) -> int | None:
        """Bytes ``algo`` needs with the current math type; None when cuDNN cannot run it."""
        size = ctypes.c_size_t(0)
        descs = (self.x_desc, self.w_desc, self.conv_desc, self.y_desc)
        with borrow_handle() as h:
            st = lib().cudnnGetConvolutionForwardWorkspaceSize(h, *descs, algo, ctypes.byref(size))
        return int(size.value) if st == CUDNN_STATUS_SUCCESS else None

    # -- algorithm choice ------------------------------------------------------------------------------
    def acceptable(self, perf: FwdAlgoPerf, limit: int) -> bool:
        """A search result that ran, fits ``limit`` and keeps the requested precision (no float inputs
        rounded to half; where TF32 is off, neither TF32 nor FFT/Winograd transforms)."""
        narrowing = perf.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
        tf32 = self.no_tf32 and (perf.mathType == CUDNN_TENSOR_OP_MATH or perf.algo in _TRANSFORM_ALGOS)
        return perf.status == CUDNN_STATUS_SUCCESS and perf.memory <= limit and not narrowing and not tf32

    def choose(self, algo: int, math: int, limit: int) -> bool:
        """Take ``algo`` under ``math`` when cuDNN can run it within ``limit`` bytes of workspace."""
        self.set_math(CUDNN_FMA_MATH if self.no_tf32 else math)
        ws = self.workspace(algo)
        if ws is None or ws > limit:
            self.set_math(self.wanted_math)
            return False
        self.algo, self.workspace_size = algo, ws
        return True

    def restore(self, saved: dict, limit: int) -> bool:
        """Use a saved choice when it is for this convolution and cuDNN still takes it."""
        algo, math = int(saved.get("algo", -1)), int(saved.get("math", self.wanted_math))
        if saved.get("key") != self.key or algo < 0 or (self.no_tf32 and algo in _TRANSFORM_ALGOS):
            return False
        if not self.choose(algo, math, limit):
            return False
        self.fused = bool(saved.get("fused")) and _fusable(self.bias, self.relu, self.algo)
        return True

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "algo": self.algo,
            "math": self.math,
            "fused": self.fused,
            "version": version(),
        }

    # -- running ---------------------------------------------------------------------------------------------
    def run(self, stream: int, x_ptr: int, w_ptr: int, y_ptr: int, bias_ptr: int = 0, z_ptr: int = 0,
            workspace_ptr: int = 0) -> None:  # fmt: skip
        """Enqueue ``y = relu?(conv(x, w) + z? + bias?)`` on ``stream``."""
        needed = {
            "x": 1,
            "w": 1,
            "y": 1,
            "bias": self.bias,
            "z": self.residual,
            "workspace": self.workspace_size,
        }
        given = {"x": x_ptr, "w": w_ptr, "y": y_ptr, "bias": bias_ptr, "z": z_ptr, "workspace": workspace_ptr}
        missing = [k for k, need in needed.items() if need and not given[k]]
        if missing or self.algo < 0:
            raise DnnError(f"null pointers {missing} or no algorithm chosen for {self.describe()}")
        with borrow_handle() as h:  # its stream is this call's until the block ends
            self._call("cudnnSetStream", h, stream)
            fn, st = self.enqueue(h, x_ptr, w_ptr, y_ptr, bias_ptr, z_ptr, workspace_ptr)
        self._check(st, fn)

    def enqueue(self, h: int, x: int, w: int, y: int, bias: int, z: int, ws: int) -> tuple[str, int]:
        """Issue the plan's calls on handle ``h``'s stream; (call, status) of the first failure or
        ('', 0)."""
        dnn, one, zero = lib(), ctypes.byref(self.one), ctypes.byref(self.zero)
        conv = (h, one, self.x_desc, x, self.w_desc, w, self.conv_desc, self.algo, ws, self.workspace_size)
        if self.fused:  # z aliasing y is allowed; with alpha2 = 0 z is not read
            zz, alpha2 = (z, one) if self.residual else (y, zero)
            tail = (alpha2, self.z_desc, zz, self.bias_desc, bias, self.act_desc, self.y_desc, y)
            return "cudnnConvolutionBiasActivationForward", dnn.cudnnConvolutionBiasActivationForward(
                *conv, *tail
            )
        in_place = self.residual and z == y and self.z_desc == self.y_desc  # y = conv + 1 * y
        calls = [("cudnnConvolutionForward", (*conv, one if in_place else zero, self.y_desc, y))]
        if self.residual and not in_place:
            calls.append(("cudnnAddTensor", (h, one, self.z_desc, z, one, self.y_desc, y)))
        if self.bias:  # the 1 x C x 1 x 1 bias broadcasts over N and the spatial axes
            calls.append(("cudnnAddTensor", (h, one, self.bias_desc, bias, one, self.y_desc, y)))
        if self.relu:  # in place: x and y share data and descriptor
            calls.append(
                ("cudnnActivationForward", (h, self.act_desc, one, self.y_desc, y, zero, self.y_desc, y))
            )
        for fn, args in calls:
            st = getattr(dnn, fn)(*args)
            if st != CUDNN_STATUS_SUCCESS:
                return fn, st
        return "", CUDNN_STATUS_SUCCESS

    def close(self) -> None:
        while self._descs:
            fn, obj = self._descs.pop()
            getattr(lib(), fn)(obj)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have unloaded the library
            pass


def plan_conv(
    dtype: DType, x: Shape, w: Shape, y: Shape, pads_begin: Sequence[int], pads_end: Sequence[int],
    strides: Sequence[int], dilations: Sequence[int], groups: int, *, bias: bool, relu: bool, residual: bool,
    allow_tf32: bool, tuned: dict | None = None, z: Shape | None = None, workspace_limit: int = 256 << 20,
    exhaustive: bool = True,
) -> ConvPlan:  # fmt: skip
    """Plan ``y = relu?(conv(x, w) + z? + bias[C_out]?)`` (cross-correlation, as ONNX Conv) on cuDNN.

    Shapes carry strides: x, y and z (default: y's shape) may have any positive-strided layout; w must
    be packed KCRS or KRSC; the bias is C_out values of y's type. ``tuned`` (a ``to_dict()``) reloads a
    choice without searching; otherwise cudnnFind times the algorithms on scratch buffers
    (``exhaustive=False``: cuDNN's heuristic only). Raises Unsupported for what cuDNN cannot take
    (asymmetric padding, broadcast tensors, no algorithm), ValueError for inconsistent shapes,
    DnnError when a call fails, libs.LibraryUnavailable when cuDNN is missing.
    """
    k, t = x.ndim() - 2, DType(dtype)
    if t not in _TYPES or not 1 <= k <= 3:
        raise Unsupported(f"cuDNN convolution: {t.name} with {k} spatial axes (float types, 1 to 3 axes)")
    z = y if z is None else z
    pads, strides, dils = tuple(pads_begin), tuple(strides), tuple(dilations)
    if tuple(pads_end) != pads:
        raise Unsupported(f"cuDNN convolution: asymmetric padding {list(pads)} / {list(pads_end)}")
    if {len(pads), len(strides), len(dils)} != {k} or {s.ndim() for s in (w, y, z)} != {k + 2}:
        raise ValueError(f"convolution: {k} spatial axes, but pads/strides/dilations/shapes disagree")
    if (
        any(s.type != t for s in (x, w, y, z))
        or groups < 1
        or x.lens[1] != w.lens[1] * groups
        or w.lens[0] % groups
    ):
        raise ValueError(f"convolution: types or channels of x {x}, w {w} and groups {groups} disagree")
    if y.lens != output_lens(x, w, pads, strides, dils) or z.lens != y.lens:
        raise ValueError(f"convolution: output {y} / residual {z} do not fit x {x}, w {w}")
    plan = ConvPlan(t, (x, w, y, z), (pads, strides, dils, groups), bias, relu, residual, allow_tf32)
    plan.handle = libs.current_device()
    if tuned and plan.restore(tuned, workspace_limit):
        return plan
    if restore_pick(plan, "conv", workspace_limit, exhaustive):
        return plan  # the same convolution was planned before (another block, another program)
    from .conv_search import search

    search(plan, workspace_limit, exhaustive)
    keep_pick(plan, "conv", workspace_limit, exhaustive)
    return plan
