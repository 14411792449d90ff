"""GEMM on cuBLASLt (through ctypes): one plan per GEMM, chosen once, replayed inside a CUDA graph.

The IR speaks row-major; cuBLASLt speaks column-major. Row-major ``m x n`` memory is the column-major
``n x m`` transpose, so a row-major ``D = A @ B`` is computed as ``D^T = B^T @ A^T`` with A and B
swapped; each operand's transpose flag follows from which of its strides is 1 (``map_gemm``).

Quantised GEMMs (``quant_dot``): int8 A/B with int32 C/D, compute and scale type (IMMA), and fp8 E4M3
A/B with float C/D, compute and scale type (Ada/Hopper and newer); their documented conditions are
checked here (``quant_layout_reason``) so a plan never reaches a kernel that cannot take it, and the
lowering (``quant.py``) lays operands out to meet them.

Enum values carry the C names from cublasLt.h / cublas_api.h / library_types.h on purpose:
``tools/check_gpu_constants.py`` compiles a program against the real headers and compares every one.
"""

from __future__ import annotations

import ctypes
from dataclasses import astuple, dataclass

from ...ir.dtypes import DType
from . import libs, warm_algos
from .kernels.spec import Unsupported
from .libs import HeuristicResult, MatmulAlgo

CUDA_R_32F = 0
CUDA_R_64F = 1
CUDA_R_16F = 2
CUDA_R_16BF = 14
CUDA_R_8I = 3
CUDA_R_32I = 10
CUDA_R_8F_E4M3 = 28
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
CUBLAS_COMPUTE_64F = 70
CUBLAS_COMPUTE_32I = 72
CUBLAS_OP_N = 0
CUBLAS_OP_T = 1
CUBLAS_STATUS_SUCCESS = 0
CUBLAS_STATUS_NOT_SUPPORTED = 15
CUBLASLT_MATMUL_DESC_TRANSA = 3
CUBLASLT_MATMUL_DESC_TRANSB = 4
CUBLASLT_MATMUL_DESC_EPILOGUE = 7
CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8
CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5
CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6
CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1
CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5
CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6
CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7
CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
CUBLASLT_EPILOGUE_DEFAULT = 1
CUBLASLT_EPILOGUE_RELU = 2
CUBLASLT_EPILOGUE_BIAS = 4
CUBLASLT_EPILOGUE_RELU_BIAS = 6

HEURISTIC_REQUESTS = 8
_ALIGNMENT_PREFS = (
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
)
# (bias, relu) -> epilogue
_EPILOGUES = {
    (False, False): CUBLASLT_EPILOGUE_DEFAULT,
    (False, True): CUBLASLT_EPILOGUE_RELU,
    (True, False): CUBLASLT_EPILOGUE_BIAS,
    (True, True): CUBLASLT_EPILOGUE_RELU_BIAS,
}
_P = ctypes.c_void_p


class BlasError(RuntimeError):
    """A cuBLASLt call failed; the message names the call, the status and the GEMM."""


@dataclass(frozen=True)
class MatLayout:
    """Strides in elements: (i, j) of batch b is at ``b*batch_stride + i*row_stride + j*col_stride``."""

    row_stride: int
    col_stride: int
    batch_stride: int = 0


@dataclass(frozen=True)
class Stored:
    """An operand as cuBLASLt sees it: the column-major ``rows x cols`` matrix its memory holds, and the
    op (N or T) that makes it the factor the product needs."""

    op: int
    rows: int
    cols: int
    ld: int
    batch_stride: int


# IR type -> (cudaDataType of A/B/C/D/bias, compute type (float: without TF32), scale type, host scalar)
_TYPES = {
    DType.float_type: (CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, ctypes.c_float),
    DType.half_type: (CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, ctypes.c_float),
    DType.bf16_type: (CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, ctypes.c_float),
    DType.double_type: (CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F, ctypes.c_double),
    # quant_dot operands: A/B are the key's type, C/D the accumulator's (QUANT_OUT)
    DType.int8_type: (CUDA_R_8I, CUBLAS_COMPUTE_32I, CUDA_R_32I, ctypes.c_int32),
    DType.fp8e4m3fn_type: (CUDA_R_8F_E4M3, CUBLAS_COMPUTE_32F, CUDA_R_32F, ctypes.c_float),
}
# quant_dot operand type -> (IR type of C/D, cudaDataType of C/D, K and leading-dimension multiple of A/B):
# IMMA wants m, k and lda/ldb/ldc multiples of 4 in the TN form; FP8 wants 16-byte aligned dims (k % 16).
QUANT_OUT = {
    DType.int8_type: (DType.int32_type, CUDA_R_32I, 4),
    DType.fp8e4m3fn_type: (DType.float_type, CUDA_R_32F, 16),
}


def lib() -> ctypes.CDLL:
    return libs.cublaslt()


def status_name(status: int) -> str:
    try:
        name = lib().cublasLtGetStatusName(status)
        return name.decode() if name else f"cuBLAS status {status}"
    except Exception:  # noqa: BLE001 - naming an error must not raise another
        return f"cuBLAS status {status}"


def version() -> int:
    return int(lib().cublasLtGetVersion())


def _create_handle() -> int:
    p = _P()
    st = lib().cublasLtCreate(ctypes.byref(p))
    if st != CUBLAS_STATUS_SUCCESS:
        raise BlasError(f"cublasLtCreate failed: {status_name(st)}")
    return int(p.value or 0)


_HANDLES = libs.DeviceHandles(_create_handle)


def handle() -> int:
    """The cuBLASLt handle of the current device, created on first use and kept for the process."""
    return _HANDLES.get()


def _row_major(lay: MatLayout, rows: int, cols: int, what: str) -> tuple[bool, int]:
    """``(True, ld)`` when the ``rows x cols`` operand is stored row-major, ``(False, ld)`` when stored
    column-major; a unit extent's stride does not matter. Anything else cuBLASLt cannot read."""
    if (lay.col_stride == 1 or cols == 1) and (rows == 1 or lay.row_stride >= cols):
        return True, max(lay.row_stride, cols)
    if (lay.row_stride == 1 or rows == 1) and (cols == 1 or lay.col_stride >= rows):
        return False, max(lay.col_stride, rows)
    raise Unsupported(
        f"cuBLASLt GEMM: {what} ({rows}x{cols}, strides {lay.row_stride},{lay.col_stride}) has no unit "
        "stride with a large enough leading dimension; make it contiguous first"
    )


def span(lay: MatLayout, rows: int, cols: int, batch: int) -> int:
    """Elements a strided operand touches (the size of a buffer that holds it)."""
    steps = ((batch, lay.batch_stride), (rows, lay.row_stride), (cols, lay.col_stride))
    return sum((n - 1) * abs(s) for n, s in steps) + 1


def map_gemm(
    batch: int, m: int, n: int, k: int, a: MatLayout, b: MatLayout, c: MatLayout, bias: bool
) -> tuple[bool, Stored, Stored, Stored]:
    """Row-major ``D = A @ B`` as cuBLASLt's column-major ``D' = op(P) @ op(Q)``: ``(swap, P, Q, D')``.

    A row-major D is stored as column-major ``D^T``, so ``swap`` computes ``D^T = B^T @ A^T`` (P is our
    B); a column-major D is computed as it is (P is our A). An operand whose storage already is the
    factor needed takes op N, else T. cuBLASLt adds its bias per row of D', i.e. per column of a
    row-major D, so a bias needs the swap.
    """
    a_rm, lda = _row_major(a, m, k, "A")
    b_rm, ldb = _row_major(b, k, n, "B")
    swap, ldd = _row_major(c, m, n, "C/D")
    if bias and not swap:
        raise Unsupported("cuBLASLt GEMM: a bias needs a row-major output (cuBLASLt adds per row of D')")
    if batch > 1 and c.batch_stride < span(c, m, n, 1):
        raise Unsupported(f"cuBLASLt GEMM: output batch stride {c.batch_stride} makes matrices overlap")
    if batch > 1 and min(a.batch_stride, b.batch_stride) < 0:
        raise Unsupported("cuBLASLt GEMM: negative batch stride")

    def stored(lay: MatLayout, rm: bool, ld: int, rows: int, cols: int) -> Stored:
        mem = (cols, rows) if rm else (rows, cols)  # row-major storage holds the transpose
        op = CUBLAS_OP_N if rm == swap else CUBLAS_OP_T
        return Stored(op, *mem, ld, lay.batch_stride if batch > 1 else 0)

    pa, pb = stored(a, a_rm, lda, m, k), stored(b, b_rm, ldb, k, n)
    d = Stored(CUBLAS_OP_N, *((n, m) if swap else (m, n)), ldd, c.batch_stride if batch > 1 else 0)
    return (swap, pb, pa, d) if swap else (swap, pa, pb, d)


def quant_layout_reason(dtype: DType, batch: int, p: Stored, q: Stored, d: Stored) -> str | None:
    """Why cuBLASLt's int8 (IMMA) or fp8 kernels cannot take the mapped GEMM ``D' = op(P) @ op(Q)``
    (None: they can). Both need the TN form: op(P) = P^T and op(Q) = Q, i.e. both operands stored with K
    contiguous; cuBLASLt's m (rows of D') and k, and every leading dimension, must be multiples of 4
    (16 bytes of the 4-byte D), fp8's k and A/B leading dimensions multiples of 16."""
    kq = QUANT_OUT[dtype][2]
    what = f"cuBLASLt {dtype.name} GEMM"
    if p.op != CUBLAS_OP_T or q.op != CUBLAS_OP_N:
        return f"{what}: only the TN form (both operands K-contiguous) has kernels"
    m_lt, k = p.cols, p.rows  # P is stored k x m and used transposed
    if k % kq or p.ld % kq or q.ld % kq:
        return f"{what}: k={k}, lda={p.ld}, ldb={q.ld} must be multiples of {kq}"
    if m_lt % 4 or d.ld % 4:
        return f"{what}: m={m_lt} and ldc={d.ld} must be multiples of 4"
    if batch > 1 and (p.batch_stride % kq or q.batch_stride % kq):
        return f"{what}: batch strides {p.batch_stride}, {q.batch_stride} must be multiples of {kq}"
    return None


class GemmPlan:
    """A planned GEMM: descriptors, chosen algorithm and workspace size; ``run`` enqueues it."""

    def __init__(self, dtype: DType, batch: int, m: int, n: int, k: int, layouts: tuple[MatLayout, ...],
                 alpha: float, beta: float, bias: bool, relu: bool, tf32: bool,
                 alignment: int) -> None:  # fmt: skip
        self.dtype, self.batch, self.m, self.n, self.k = DType(dtype), batch, m, n, k
        if self.dtype not in _TYPES:
            raise Unsupported(f"cuBLASLt GEMM: element type {self.dtype.name} is not supported")
        self.layouts, self.bias, self.relu, self.alignment = layouts, bias, relu, alignment
        self.data_type, compute, scale, scalar = _TYPES[self.dtype]
        quant = QUANT_OUT.get(self.dtype)
        if quant is not None and (bias or relu):
            raise Unsupported(f"cuBLASLt {self.dtype.name} GEMM: no bias/relu epilogue on its result")
        self.out_dtype, self.out_type = (quant[0], quant[1]) if quant else (self.dtype, self.data_type)
        if self.dtype == DType.float_type and tf32:
            compute = CUBLAS_COMPUTE_32F_FAST_TF32
        if scalar is ctypes.c_int32:  # IMMA's scale type is int32: alpha and beta are integers
            alpha, beta = int(alpha), int(beta)
        self.alpha, self.beta = scalar(alpha), scalar(beta)
        self.algo, self.workspace_size = MatmulAlgo(), 0
        self.handle = 0  # set by plan_gemm: creating one needs a GPU, describing the GEMM does not
        self._descs: list[tuple[str, int]] = []  # (destroy function, descriptor), freed by close()
        self._bias_ptr = 0
        strides = [astuple(x) for x in layouts]
        self.key = (
            f"{self.dtype.name}:{batch}x{m}x{n}x{k}:{strides}:{compute}:{bias}{relu}:{beta != 0}:{alignment}"
        )
        self.swap, p, q, d = map_gemm(batch, m, n, k, *layouts, bias)
        # GEMMs whose algorithms may serve each other at other sizes (warm_algos.py)
        self.family = (self.dtype.name, compute, bias, relu, beta != 0, alignment, p.op, q.op, self.swap,
                       batch > 1)  # fmt: skip
        self._noted = False  # the chosen algorithm's run is known to warm_algos
        why = quant_layout_reason(self.dtype, batch, p, q, d) if quant else None
        if why:
            raise Unsupported(why)
        self.p_layout, self.q_layout = (self._layout(x, self.data_type) for x in (p, q))
        self.d_layout = self._layout(d, self.out_type)
        self.desc = self._create("cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy", compute, scale)
        set_ = "cublasLtMatmulDescSetAttribute"
        self._set(set_, self.desc, CUBLASLT_MATMUL_DESC_TRANSA, ctypes.c_int32(p.op))
        self._set(set_, self.desc, CUBLASLT_MATMUL_DESC_TRANSB, ctypes.c_int32(q.op))
        self._set(set_, self.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, ctypes.c_uint32(_EPILOGUES[bias, relu]))

    def describe(self) -> str:
        a, b, c = (astuple(x) for x in self.layouts)
        extra = " +bias" * self.bias + " +relu" * self.relu
        dims = f"batch={self.batch} m={self.m} n={self.n} k={self.k}"
        return f"GEMM {self.dtype.name} {dims} A{a} B{b} C{c}{extra}"

    def _check(self, st: int, fn: str) -> None:
        if st != CUBLAS_STATUS_SUCCESS:
            raise BlasError(f"{fn} failed: {status_name(st)} for {self.describe()}")

    def _call(self, fn: str, *args: object) -> None:
        self._check(getattr(lib(), fn)(*args), fn)

    def _create(self, create: str, destroy: str, *args: object) -> int:
        p = _P()
        self._call(create, ctypes.byref(p), *args)
        self._descs.append((destroy, int(p.value or 0)))
        return int(p.value or 0)

    def _set(self, fn: str, obj: int, attr: int, value: ctypes._SimpleCData) -> None:
        self._call(fn, obj, attr, ctypes.byref(value), ctypes.sizeof(value))

    def _layout(self, x: Stored, data_type: int) -> int:
        dims = (data_type, x.rows, x.cols, x.ld)
        lay = self._create("cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", *dims)
        if self.batch > 1:
            set_ = "cublasLtMatrixLayoutSetAttribute"
            self._set(set_, lay, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, ctypes.c_int32(self.batch))
            self._set(set_, lay, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, ctypes.c_int64(x.batch_stride))
        return lay

    @property
    def _all_layouts(self) -> tuple[int, int, int, int]:
        return self.p_layout, self.q_layout, self.d_layout, self.d_layout  # C and D share one layout

    # -- algorithm choice ------------------------------------------------------------------------------
    def heuristics(self, workspace_limit: int, count: int = HEURISTIC_REQUESTS) -> list[HeuristicResult]:
        """cuBLASLt's candidates that succeed and fit ``workspace_limit``, best first."""
        pref = self._create("cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy")
        try:
            set_ = "cublasLtMatmulPreferenceSetAttribute"
            self._set(set_, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(workspace_limit))
            for attr in _ALIGNMENT_PREFS if self.alignment < 256 else ():  # the default assumes 256 bytes
                self._set(set_, pref, attr, ctypes.c_uint32(self.alignment))
            results, got = (HeuristicResult * count)(), ctypes.c_int(0)
            args = (self.handle, self.desc, *self._all_layouts, pref, count, results, ctypes.byref(got))
            st = lib().cublasLtMatmulAlgoGetHeuristic(*args)
        finally:
            self._descs.remove(("cublasLtMatmulPreferenceDestroy", pref))
            lib().cublasLtMatmulPreferenceDestroy(pref)
        if st == CUBLAS_STATUS_NOT_SUPPORTED:  # no kernel for this configuration at all
            return []
        self._check(st, "cublasLtMatmulAlgoGetHeuristic")
        fits = [r for r in results[: got.value] if r.workspaceSize <= workspace_limit]
        return [r for r in fits if r.state == CUBLAS_STATUS_SUCCESS]

    def restore(self, saved: dict, workspace_limit: int) -> bool:
        """Use a saved algorithm when it is for this GEMM and this cuBLASLt and still passes AlgoCheck."""
        raw = bytes.fromhex(str(saved.get("algo", "")))
        if saved.get("key") != self.key or saved.get("version") != version():
            return False
        return self.take(raw, workspace_limit)

    def take(self, raw: bytes, workspace_limit: int) -> bool:
        """Use algorithm ``raw`` (a cublasLtMatmulAlgo_t's bytes) if AlgoCheck accepts it for this GEMM
        within ``workspace_limit``."""
        if len(raw) != ctypes.sizeof(MatmulAlgo):
            return False
        algo, result = MatmulAlgo.from_buffer_copy(raw), HeuristicResult()
        args = (self.handle, self.desc, *self._all_layouts, ctypes.byref(algo), ctypes.byref(result))
        st = lib().cublasLtMatmulAlgoCheck(*args)
        if st != CUBLAS_STATUS_SUCCESS or result.workspaceSize > workspace_limit:
            return False
        self.algo, self.workspace_size, self._noted = algo, int(result.workspaceSize), False
        return True

    def choose(self, candidate: HeuristicResult) -> None:
        self.algo = MatmulAlgo.from_buffer_copy(bytes(candidate.algo))
        self.workspace_size = int(candidate.workspaceSize)
        self._noted = False

    def to_dict(self) -> dict:
        algo = bytes(self.algo).hex()
        return {"key": self.key, "version": version(), "algo": algo, "workspace": self.workspace_size}

    # -- running ---------------------------------------------------------------------------------------------
    def run(self, stream: int, a_ptr: int, b_ptr: int, c_ptr: int, d_ptr: int, bias_ptr: int = 0,
            workspace_ptr: int = 0) -> None:  # fmt: skip
        """Enqueue ``D = relu?(alpha*A@B + beta*C + bias?)`` on ``stream``; C may be D (in place)."""
        if self.beta.value == 0 and not c_ptr:
            c_ptr = d_ptr
        ptrs = {"A": a_ptr, "B": b_ptr, "C": c_ptr, "D": d_ptr, **({"bias": bias_ptr} if self.bias else {})}
        bad = [f"{name}={p:#x}" for name, p in ptrs.items() if not p or p % self.alignment]
        if bad or (self.workspace_size and not workspace_ptr):
            raise BlasError(f"pointers {bad} are null or not {self.alignment}-byte aligned, or no workspace "
                            f"({self.workspace_size} bytes needed) for {self.describe()}")  # fmt: skip
        if self.bias and bias_ptr != self._bias_ptr:  # read when the call is issued (and captured)
            attr = CUBLASLT_MATMUL_DESC_BIAS_POINTER
            self._set("cublasLtMatmulDescSetAttribute", self.desc, attr, _P(bias_ptr))
            self._bias_ptr = bias_ptr
        p, q = (b_ptr, a_ptr) if self.swap else (a_ptr, b_ptr)
        self._call("cublasLtMatmul", self.handle, self.desc, ctypes.byref(self.alpha), p, self.p_layout, q,
                   self.q_layout, ctypes.byref(self.beta), c_ptr, self.d_layout, d_ptr, self.d_layout,
                   ctypes.byref(self.algo), workspace_ptr, self.workspace_size, stream)  # fmt: skip
        if not self._noted:
            warm_algos.note_run(self, bytes(self.algo))
            self._noted = True

    def close(self) -> None:
        while self._descs:
            fn, obj = self._descs.pop()
            getattr(lib(), fn)(obj)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have unloaded the library
            pass
