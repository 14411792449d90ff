"""Find and load NVIDIA's vendor libraries (cuBLASLt, cuDNN) with ctypes, once per process.

Search order for each library: an environment variable holding a full path, then a copy some other
library (ORT's CUDA EP, PyTorch) has already loaded into the process, then the folders of the
``nvidia`` pip packages (a namespace package: every entry of its ``__path__``), then the plain soname
(the system's loader path), then ``$CUDA_HOME/lib64``. A miss raises ``LibraryUnavailable`` naming every
place that was tried, so a user sees at once what to install or which variable to set.

cuDNN 9 is a small front library that dlopens its parts (ops, cnn, engines...) by soname at first use;
those are preloaded from the front library's own folder with RTLD_GLOBAL so that a pip-installed cuDNN
works without LD_LIBRARY_PATH (the loader then finds them already loaded under that soname).

Why ctypes and not NVIDIA's Python bindings (probed on an H100: ``tools/probe_nvidia_bindings.py``):
nvmath-python's ``bindings.cublasLt`` takes raw pointers and captures in a CUDA graph, but it is a
one-to-one map of the same 15 cuBLASLt calls declared here (checked against the real headers by
``tools/check_gpu_constants.py``) and is marked experimental, so it would add a dependency without
changing a launch; cudnn-frontend's graph API (its SDPA is 8 µs against our attention kernel's 22 µs
per BERT-base bs8 layer) needs a lowering of ``fused_attention`` to a cuDNN graph of its own, not a
swap of these declarations. Modules and launches already go through ``cuda.bindings`` (``cuda.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

CUBLASLT_ENV = "MIGRAPHX_EP_CUBLASLT"
CUDNN_ENV = "MIGRAPHX_EP_CUDNN"
CUBLASLT_NAMES = ("libcublasLt.so.13", "libcublasLt.so.12")
CUDNN_NAMES = ("libcudnn.so.9",)
# Sub-folders of the ``nvidia`` namespace package that hold shared libraries (CUDA 13 wheels put
# everything under cu13/; CUDA 12 wheels use one folder per component).
PIP_FOLDERS = ("cu13/lib", "cublas/lib", "cu12/lib", "cudnn/lib")
# cuDNN's parts in dependency order (graph first: the others link against it). Engines that need
# libcuda.so.1 fail to preload on a machine without a driver; cuDNN then reports it at first use.
CUDNN_PARTS = (
    "libcudnn_graph.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_heuristic.so.9",
    "libcudnn_engines_precompiled.so.9",
    "libcudnn_engines_runtime_compiled.so.9",
    "libcudnn_engines_tensor_ir.so.9",
)


class LibraryUnavailable(RuntimeError):  # noqa: N818 - reads better at the raise site
    """A vendor library could not be loaded; the message lists what was searched."""


_LOCK = threading.Lock()
_LOADED: dict[str, ctypes.CDLL] = {}
_FAILED: dict[str, str] = {}
PATHS: dict[str, str] = {}  # library key -> where it was loaded from (for notices and bug reports)
PRELOAD_ERRORS: dict[str, str] = {}  # cuDNN part -> why it did not preload


def pip_folders() -> list[Path]:
    """Existing library folders of the installed ``nvidia`` pip packages."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return [Path(r) / sub for r in roots for sub in PIP_FOLDERS if (Path(r) / sub).is_dir()]


def _cuda_home_folders() -> list[Path]:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    return [p for p in (Path(home) / "lib64", Path(home) / "targets/x86_64-linux/lib") if p.is_dir()]


def already_loaded(names: tuple[str, ...], maps: str | None = None) -> list[str]:
    """Paths of libraries with one of ``names`` (sonames) already mapped into this process.

    Another user of CUDA in the process (ORT's CUDA EP, PyTorch) may have loaded its own copy of
    cuDNN or cuBLASLt from another folder. Loading a second copy by path is unsafe: cuDNN's parts are
    found by soname, so our front library would run with the first copy's parts (the segfault seen
    in cuDNN's search after ORT's CUDA EP had run). The copy already there is the one to share."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return []
    found: list[str] = []
    for line in maps.splitlines():
        fields = line.split(None, 5)  # address perms offset dev inode [path]
        path = fields[5].strip() if len(fields) == 6 else ""
        base = os.path.basename(path)
        # A soname's file is often its fully versioned name (libcudnn.so.9 -> libcudnn.so.9.14.0).
        if path.startswith("/") and any(base == n or base.startswith(n + ".") for n in names):
            if path not in found:
                found.append(path)
    return found


def candidates(env: str, names: tuple[str, ...]) -> list[str]:
    """Everything to try, in order: a full path from ``env``, a copy already loaded in the process,
    pip folders, sonames, $CUDA_HOME."""
    out: list[str] = []
    if os.environ.get(env):
        return [os.environ[env]]  # an explicit choice is never second-guessed
    out += already_loaded(names)
    out += [str(folder / n) for n in names for folder in pip_folders() if (folder / n).is_file()]
    out += list(names)
    out += [str(folder / n) for n in names for folder in _cuda_home_folders() if (folder / n).is_file()]
    return out


def _open(key: str, env: str, names: tuple[str, ...], table: dict, before: object = None) -> ctypes.CDLL:
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        if key in _FAILED:
            raise LibraryUnavailable(_FAILED[key])
        tried: list[str] = []
        for cand in candidates(env, names):
            if os.sep in cand and not Path(cand).is_file():
                tried.append(f"{cand} (no such file)")
                continue
            try:
                if callable(before):
                    before(cand)
                lib = ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                tried.append(f"{cand} ({e})")
                continue
            declare(lib, table)
            _LOADED[key] = lib
            PATHS[key] = cand
            return lib
        hint = f"set {env} to the library's full path, or pip install the NVIDIA wheel that ships it"
        _FAILED[key] = f"{key} could not be loaded; tried: {'; '.join(tried) or 'nothing'} ({hint})"
        raise LibraryUnavailable(_FAILED[key])


def _preload_cudnn_parts(front: str) -> None:
    """Load cuDNN's parts from the folder of ``front`` (a path; a bare soname has no folder to use)."""
    if os.sep not in front:
        return
    folder = Path(front).parent
    for part in CUDNN_PARTS:
        path = folder / part
        if not path.is_file():
            continue
        try:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            PRELOAD_ERRORS[part] = str(e)


# -- the C structures and functions blas.py and dnn.py use (cublasLt.h, cudnn_cnn.h) ----------------------
class MatmulAlgo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: 64 opaque bytes, reusable with the same cuBLASLt version."""

    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""

    _fields_ = [
        ("algo", MatmulAlgo),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


class FwdAlgoPerf(ctypes.Structure):
    """cudnnConvolutionFwdAlgoPerf_t."""

    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t),
        ("determinism", ctypes.c_int),
        ("mathType", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]


# Every status-returning function gives an int (cublasStatus_t / cudnnStatus_t); handles, descriptors,
# device pointers, host scalars and streams are all passed as void pointers.
_P, _I, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_PP, _IP, _U64, _I64 = ctypes.POINTER(_P), ctypes.POINTER(_I), ctypes.c_uint64, ctypes.c_int64
_HR, _ALGO, _PERF = ctypes.POINTER(HeuristicResult), ctypes.POINTER(MatmulAlgo), ctypes.POINTER(FwdAlgoPerf)
CUBLASLT_FUNCTIONS: dict[str, tuple[object, list]] = {
    "cublasLtCreate": (_I, [_PP]),
    "cublasLtGetVersion": (_SZ, []),
    "cublasLtGetStatusName": (ctypes.c_char_p, [_I]),
    "cublasLtMatmulDescCreate": (_I, [_PP, _I, _I]),
    "cublasLtMatmulDescDestroy": (_I, [_P]),
    "cublasLtMatmulDescSetAttribute": (_I, [_P, _I, _P, _SZ]),
    "cublasLtMatrixLayoutCreate": (_I, [_PP, _I, _U64, _U64, _I64]),
    "cublasLtMatrixLayoutDestroy": (_I, [_P]),
    "cublasLtMatrixLayoutSetAttribute": (_I, [_P, _I, _P, _SZ]),
    "cublasLtMatmulPreferenceCreate": (_I, [_PP]),
    "cublasLtMatmulPreferenceDestroy": (_I, [_P]),
    "cublasLtMatmulPreferenceSetAttribute": (_I, [_P, _I, _P, _SZ]),
    "cublasLtMatmulAlgoGetHeuristic": (_I, [_P, _P, _P, _P, _P, _P, _P, _I, _HR, _IP]),
    "cublasLtMatmulAlgoCheck": (_I, [_P, _P, _P, _P, _P, _P, _ALGO, _HR]),
    "cublasLtMatmul": (_I, [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _ALGO, _P, _SZ, _P]),
}
CUDNN_FUNCTIONS: dict[str, tuple[object, list]] = {
    "cudnnCreate": (_I, [_PP]),
    "cudnnSetStream": (_I, [_P, _P]),
    "cudnnGetErrorString": (ctypes.c_char_p, [_I]),
    "cudnnGetVersion": (_SZ, []),
    "cudnnCreateTensorDescriptor": (_I, [_PP]),
    "cudnnSetTensorNdDescriptor": (_I, [_P, _I, _I, _IP, _IP]),
    "cudnnDestroyTensorDescriptor": (_I, [_P]),
    "cudnnCreateFilterDescriptor": (_I, [_PP]),
    "cudnnSetFilterNdDescriptor": (_I, [_P, _I, _I, _I, _IP]),
    "cudnnDestroyFilterDescriptor": (_I, [_P]),
    "cudnnCreateConvolutionDescriptor": (_I, [_PP]),
    "cudnnSetConvolutionNdDescriptor": (_I, [_P, _I, _IP, _IP, _IP, _I, _I]),
    "cudnnSetConvolutionGroupCount": (_I, [_P, _I]),
    "cudnnSetConvolutionMathType": (_I, [_P, _I]),
    "cudnnDestroyConvolutionDescriptor": (_I, [_P]),
    "cudnnCreateActivationDescriptor": (_I, [_PP]),
    "cudnnSetActivationDescriptor": (_I, [_P, _I, _I, ctypes.c_double]),
    "cudnnDestroyActivationDescriptor": (_I, [_P]),
    "cudnnGetConvolutionForwardAlgorithmMaxCount": (_I, [_P, _IP]),
    "cudnnFindConvolutionForwardAlgorithmEx": (_I, [_P, _P, _P, _P, _P, _P, _P, _P, _I, _IP, _PERF, _P, _SZ]),
    "cudnnGetConvolutionForwardAlgorithm_v7": (_I, [_P, _P, _P, _P, _P, _I, _IP, _PERF]),
    "cudnnGetConvolutionForwardWorkspaceSize": (_I, [_P, _P, _P, _P, _P, _I, ctypes.POINTER(_SZ)]),
    "cudnnConvolutionForward": (_I, [_P, _P, _P, _P, _P, _P, _P, _I, _P, _SZ, _P, _P, _P]),
    "cudnnConvolutionBiasActivationForward": (
        _I,
        [_P, _P, _P, _P, _P, _P, _P, _I, _P, _SZ, _P, _P, _P, _P, _P, _P, _P, _P],
    ),
    "cudnnAddTensor": (_I, [_P, _P, _P, _P, _P, _P, _P]),
    "cudnnActivationForward": (_I, [_P, _P, _P, _P, _P, _P, _P, _P]),
}


def declare(lib: ctypes.CDLL, table: dict[str, tuple[object, list]]) -> None:
    """Set ``restype``/``argtypes`` of every function in ``table``. A function the loaded version lacks
    stays undeclared; calling it raises AttributeError, never a crash."""
    for name, (restype, argtypes) in table.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = restype, argtypes


def cublaslt() -> ctypes.CDLL:
    """The cuBLASLt library with its functions declared (cached); raises LibraryUnavailable."""
    return _open("cuBLASLt", CUBLASLT_ENV, CUBLASLT_NAMES, table=CUBLASLT_FUNCTIONS)


def cudnn() -> ctypes.CDLL:
    """The cuDNN 9 front library, parts preloaded, functions declared (cached); raises LibraryUnavailable."""
    return _open("cuDNN", CUDNN_ENV, CUDNN_NAMES, table=CUDNN_FUNCTIONS, before=_preload_cudnn_parts)


def reset_cache() -> None:
    """Forget earlier results (tests that change the environment variables use this)."""
    with _LOCK:
        _LOADED.clear()
        _FAILED.clear()
        PATHS.clear()
        PRELOAD_ERRORS.clear()


def current_device() -> int:
    """The current CUDA device's ordinal."""
    from . import cuda

    return cuda.Device.current().id


class HandlePool:
    """Library handles per device, each lent to one caller at a time (``borrow``), made as needed and
    kept for the process. cuDNN keeps a stream in its handle (``cudnnSetStream``, then the call), and a
    handle must not serve two threads at once: a Run launching its steps eagerly and a background
    search would set each other's streams, putting a convolution on the wrong stream (unordered, or
    outside a graph being captured) or a search's kernels after their scratch memory is freed. The pool
    grows to the number of callers at once."""

    def __init__(self, create: Callable[[], int], device: Callable[[], int] | None = None) -> None:
        self._create = create
        self._device = device or current_device
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}

    @contextlib.contextmanager
    def borrow(self) -> Iterator[int]:
        dev = self._device()
        with self._lock:
            free = self._free.setdefault(dev, [])
            h = free.pop() if free else 0
        h = h or self._create()
        try:
            yield h
        finally:
            with self._lock:
                self._free[dev].append(h)


class DeviceHandles:
    """One library handle per device, made by ``create`` on first use and kept for the process
    (cuBLASLt and cuDNN handles are per context and cost milliseconds to create)."""

    def __init__(self, create: Callable[[], int]) -> None:
        self._create = create
        self._lock = threading.Lock()
        self._by_device: dict[int, int] = {}

    def get(self) -> int:
        from . import cuda

        dev = cuda.Device.current().id
        with self._lock:
            if dev not in self._by_device:
                self._by_device[dev] = self._create()
            return self._by_device[dev]
