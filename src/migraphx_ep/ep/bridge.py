"""The only Python the C++ shell (csrc/) calls; everything here forwards to a *backend*.

Backend protocol (default backend: the module ``migraphx_ep.ep.provider``; tests inject a stub with
:func:`set_backend`)::

    backend.create_ep(options: dict[str, str]) -> ep
    ep.get_capability(graph: dict) -> list[list[int]]      # groups of indices into graph["nodes"]
    ep.compile(graph: dict, fused_node_name: str) -> compiled
    compiled.run(inputs: list[np.ndarray]) -> list[np.ndarray]
    compiled.native_plan(inputs) -> dict | None                # optional (csrc/native_run.h)
    compiled.release(), ep.release()                        # optional
    ep.set_session_config(session: dict[str, str])          # optional: the "ep.context_*" entries
    ep.allocator_settings() -> dict                         # optional: GPU allocator options
    ep.ep_context(compiled, fused_node_name) -> dict        # optional: writing EPContext models
    ep.compatibility_info() -> str                          # optional: "" writes none
    backend.validate_compatibility(info: bytes) -> int      # optional: OrtCompiledModelCompatibility

Calls from ORT, all with the GIL held (the shell takes it; ``session.run`` itself releases it):

- ``create_ep(options, session)``: OrtEpFactory::CreateEp. ``options`` = every session config entry
  ``ep.migraphxexecutionprovider.<key>``, prefix stripped, keys as the user wrote them; ``session`` = the
  session's ``ep.context_*`` entries, keys whole (set by ModelCompiler), handed to ``set_session_config``.
- ``get_capability(ep, graph)``: OrtEp::GetCapability, once per (sub)graph. Each group becomes one fused
  node and must be *convex* (no unclaimed node on a path between two claimed ones) or ORT drops them all.
  Exceptions here are only logged by ORT (the graph then runs without this EP).
- ``compile(ep, graph, fused_node_name)``: OrtEp::Compile, once per fused node. ``graph["inputs"]`` /
  ``graph["outputs"]`` are in the order of the fused node's inputs/outputs at run time (constant
  initializers consumed by the group are fused-node inputs too, and also appear in "initializers").
- ``ep_context(ep, compiled, fused_node_name)``: OrtEp::Compile when ORT writes an EPContext model, once
  per fused node after ``compile``: ``{"name", "inputs", "outputs", "attributes": {name: int | str |
  bytes}}`` of the ``com.microsoft`` EPContext node that replaces it in that model.
- ``compatibility_info(ep)``: OrtEp::GetCompiledModelCompatibilityInfo, once ORT has written an
  EPContext model's nodes: the string it stores in that model's metadata ("" stores none).
- ``validate_compatibility(info)``: OrtEpFactory::ValidateCompiledModelCompatibilityInfo (no EP: the
  factory's), with the stored string's bytes as ORT passed them; returns an OrtCompiledModelCompatibility
  value (EP_NOT_APPLICABLE when the backend has no opinion). Bad strings are a verdict, not an error.
- ``run(compiled, inputs)``: OrtNodeComputeInfo::Compute, possibly from several threads at once.
  Inputs are read-only zero-copy views of ORT's tensors, valid only during the call: copy what you keep.
  Return one array per output (numpy scalars / 0-d and 0-size arrays are fine); dtypes must match.
- ``native_plan(compiled, inputs)`` right after a ``run`` (optional): a dict the shell keeps, keyed by
  the inputs' dims, to run later calls with those dims natively (no Python); None: keep calling ``run``;
  False: not yet (a background compile is under way, or the program captures its CUDA graph at a later
  Run), ask again after the next ``run``.
- ``release(compiled)`` when ORT releases the compute infos; ``release_ep(ep)`` on ReleaseEp.

Any exception raised becomes an ORT error status (ORT_FAIL) whose message carries the exception type and
message, so ``InferenceSession(...)`` / ``sess.run`` raise it; the process never aborts.

Graph dict (the same for GetCapability's whole graph and Compile's fused subgraph)::

    {"name": str,
     "nodes": [{"index": int, "name": str, "op_type": str, "domain": str ("" = ai.onnx),
                "since_version": int, "inputs": [name | "" for a missing optional], "outputs": [...],
                "implicit_inputs": [...], "attributes": {name: value}, "subgraphs": {attr: graph dict}}],
     "inputs": [names], "outputs": [names],
     "values": {name: {"dtype": TensorProto elem type (0: not a tensor),
                       "shape": [int | str (symbolic) | None (unknown)] or None (rank unknown)}},
     "initializers": {name: ndarray},              # constant initializers
     "overridable_initializers": {name: ndarray},  # defaults of graph inputs (IR >= 4)
     "opsets": {domain: version},
     "model_path": str,                             # the model file ("" when loaded from bytes)
     "is_subgraph": bool}                           # a control-flow body offered on its own

Attribute values: int, float, str, list[int], list[float], list[str], ndarray (TENSOR, an owned copy),
bytes (``ep_cache_context`` only: an EPContext node's program is binary),
"<graph>" (body under node["subgraphs"]), or :class:`Unsupported` (refuse the node, say why).

Initializer arrays are read-only and never copies of large weights:

- in-memory initializers > 4 KiB are views of ORT's buffer; the session keeps that buffer alive as a
  fused-node input for its whole life, so views taken in ``compile`` stay valid until ``release``.
  Views taken in ``get_capability`` are only valid during that call.
- initializers in an external data file are ``np.memmap`` views of that file (valid while referenced);
- small ones (<= 4 KiB) are owned copies.

String tensors come through as :class:`Unsupported` (never crash), as do packed 4-bit types.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

DEFAULT_BACKEND = "migraphx_ep.ep.provider"


class Unsupported:
    """Marker for something the shell could not marshal (an attribute kind, a string tensor, ...)."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"Unsupported({self.kind!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unsupported) and other.kind == self.kind

    def __hash__(self) -> int:
        return hash(("Unsupported", self.kind))


def unsupported_attr(kind: str) -> Unsupported:
    """Called from C++ for values it cannot express (attribute types, string tensors, ...)."""
    return Unsupported(kind)


# --- backend selection ---------------------------------------------------------------------------
_backend: Any = None


def set_backend(backend: Any) -> None:
    """Use `backend` (anything with create_ep) for EPs created from now on; None restores the default."""
    global _backend
    _backend = backend


def get_backend() -> Any:
    if _backend is not None:
        return _backend
    try:
        return importlib.import_module(DEFAULT_BACKEND)
    except ModuleNotFoundError as e:
        if e.name not in (DEFAULT_BACKEND, DEFAULT_BACKEND.rpartition(".")[0]):
            raise  # the backend exists but one of its own imports is missing: show that
        raise ImportError(
            f"migraphx_ep: the default EP backend module '{DEFAULT_BACKEND}' is not available; "
            "install a complete migraphx-ep or call migraphx_ep.ep.bridge.set_backend(...)"
        ) from e


# --- entry points called by the C++ shell ---------------------------------------------------------
def create_ep(options: dict[str, str], session: dict[str, str] | None = None) -> Any:
    ep = get_backend().create_ep(dict(options))
    if session:
        _call_optional(ep, "set_session_config", dict(session))
    return ep


def get_capability(ep: Any, graph: dict) -> list[list[int]]:
    return [[int(i) for i in group] for group in ep.get_capability(graph)]


def compile(ep: Any, graph: dict, fused_node_name: str) -> Any:
    return ep.compile(graph, fused_node_name)


def ep_context(ep: Any, compiled: Any, fused_node_name: str) -> dict:
    fn = getattr(ep, "ep_context", None)
    if not callable(fn):
        raise NotImplementedError(f"the EP backend {type(ep).__name__} cannot write EPContext nodes")
    return fn(compiled, fused_node_name)


def compatibility_info(ep: Any) -> str:
    fn = getattr(ep, "compatibility_info", None)
    return str(fn()) if callable(fn) else ""


def validate_compatibility(info: bytes) -> int:
    fn = getattr(get_backend(), "validate_compatibility", None)
    return int(fn(bytes(info))) if callable(fn) else 0  # 0: OrtCompiledModelCompatibility_EP_NOT_APPLICABLE


def run(compiled: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return list(compiled.run(inputs))


def allocator_settings(ep: Any) -> dict | None:
    """The session's GPU allocator options (csrc/device_memory.h), or None for the defaults."""
    fn = getattr(ep, "allocator_settings", None)
    return fn() if callable(fn) else None


def native_plan(compiled: Any, inputs: list[np.ndarray]) -> dict | bool | None:
    """After ``run(compiled, inputs)``: a plan for the shell's native Run path (csrc/native_run.h), None
    (never for these dims), or False (not yet: ask after the next Run). Optional for backends."""
    fn = getattr(compiled, "native_plan", None)
    return fn(inputs) if callable(fn) else None


def release(compiled: Any) -> None:
    _call_optional(compiled, "release")


def release_ep(ep: Any) -> None:
    _call_optional(ep, "release")


def _call_optional(obj: Any, method: str, *args: Any) -> None:
    fn = getattr(obj, method, None)
    if callable(fn):
        fn(*args)


# --- dtype mapping (TensorProto elem type <-> numpy) ----------------------------------------------
_DTYPES: dict[int, np.dtype] = {
    k: np.dtype(v)
    for k, v in {
        1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
        9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64, 14: np.complex64,
        15: np.complex128, 16: ml_dtypes.bfloat16, 17: ml_dtypes.float8_e4m3fn,
        18: ml_dtypes.float8_e4m3fnuz, 19: ml_dtypes.float8_e5m2, 20: ml_dtypes.float8_e5m2fnuz,
    }.items()
}  # fmt: skip
_ELEM_TYPES: dict[np.dtype, int] = {v: k for k, v in _DTYPES.items()}
_NAMES = {8: "string", 21: "uint4", 22: "int4", 23: "float4e2m1"}


def elem_type_name(elem_type: int) -> str:
    dt = _DTYPES.get(elem_type)
    return str(dt) if dt is not None else _NAMES.get(elem_type, f"elem type {elem_type}")


def elem_type_of(dtype: np.dtype) -> int:
    """TensorProto elem type of a numpy dtype; TypeError if ONNX has no such tensor type here."""
    try:
        return _ELEM_TYPES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise TypeError(f"no ONNX tensor element type for numpy dtype {dtype!r}") from None


def make_array(buffer: Any, elem_type: int, shape: Sequence[int]) -> np.ndarray | Unsupported:
    """ndarray over `buffer` (a read-only memoryview for zero-copy, or bytes for an owned copy)."""
    dtype = _DTYPES.get(elem_type)
    if dtype is None or buffer is None:
        return Unsupported(f"{elem_type_name(elem_type)} tensor")
    return np.frombuffer(buffer, dtype=dtype).reshape(tuple(shape))


def empty_array(elem_type: int, shape: Sequence[int]) -> np.ndarray | Unsupported:
    """A new array for an initializer the shell copies into itself (graph_marshal.cpp ``copied_array``)."""
    dtype = _DTYPES.get(elem_type)
    if dtype is None:
        return Unsupported(f"{elem_type_name(elem_type)} tensor")
    return np.empty(tuple(shape), dtype=dtype)


def map_external(
    model_path: str, location: str, offset: int, nbytes: int, elem_type: int, shape: Sequence[Any] | None
) -> np.ndarray | None:
    """Read-only np.memmap of an initializer kept in an external data file; None if not mappable."""
    dtype = _DTYPES.get(elem_type)
    if dtype is None or shape is None or not all(isinstance(d, int) for d in shape):
        return None
    path = location if os.path.isabs(location) else os.path.join(os.path.dirname(model_path), location)
    count = int(np.prod(shape, dtype=np.int64))
    if count * dtype.itemsize != nbytes or not os.path.isfile(path):
        return None
    if count == 0:
        arr = np.zeros(tuple(shape), dtype)
        arr.flags.writeable = False
        return arr
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=tuple(shape)).view(np.ndarray)


def output_buffers(outputs: Sequence[Any], count: int) -> list[tuple[int, tuple[int, ...], np.ndarray]]:
    """(elem type, shape, contiguous uint8 bytes) per output, for the C++ copy into ORT's tensors."""
    outs = list(outputs)
    if len(outs) != count:
        raise ValueError(f"backend returned {len(outs)} outputs, the fused node has {count}")
    specs = []
    for i, out in enumerate(outs):
        arr = np.asarray(out)  # numpy scalars -> 0-d arrays
        try:
            elem = elem_type_of(arr.dtype)
        except TypeError as e:
            raise TypeError(f"output {i}: {e}") from None
        flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        specs.append((elem, tuple(int(d) for d in arr.shape), flat))
    return specs
