"""EPContext models: write a compiled partition as a ``com.microsoft`` EPContext node, and run one.

ORT's EPContext design (``ort.ModelCompiler`` / session option ``ep.context_enable=1``): each fused node
becomes one EPContext node whose ``ep_cache_context`` holds the compiled program: the ``.mxr`` file's
bytes (``embed_mode`` 1), or the name of that file beside the EPContext model (``embed_mode`` 0).
Loading such a model, GetCapability claims the EPContext nodes whose ``source`` is this EP and Compile
loads their program: nothing is parsed or compiled. The ``.mxr`` metadata records what the program was
made for (package version, target, compile options, inputs); a program made for anything else is never
run: its partition is recompiled from the original model (``onnx_model_filename``, beside the EPContext
model) with a warning, or, without it, the session fails with an error naming the difference.
Before any of this ORT checks the model's compatibility string with the factory (``ep/compat.py``).

A partition is written with exactly the programs it compiled at session creation, i.e. one for static
input dims; symbolic dims, ``migraphx_max_dynamic_batch`` and value-specialised inputs compile at Run
and are refused with a message saying so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from .. import mxr
from ..ir.program import Program
from .bridge import elem_type_name
from .compat import options_record, package_version, session_info
from .compiled import CompiledSubgraph, ShapeKey
from .epcontext_source import NotBeside, SourceUnavailable, beside_model, original_subgraph
from .options import EpOptions

log = logging.getLogger("migraphx_ep")

EP_NAME = "MIGraphXExecutionProvider"
CONTEXT_OP, CONTEXT_DOMAIN = "EPContext", "com.microsoft"
RECORD_VERSION = 1


class EpContextError(ValueError):
    """An EPContext node this EP cannot write or run (the message names the node and the reason)."""


class ContextMismatch(EpContextError):
    """A readable program made for something else (package version, target, options): recompiling its
    partition from the original model gives the right one."""


def is_context_node(node: dict) -> bool:
    return node.get("op_type") == CONTEXT_OP and node.get("domain") == CONTEXT_DOMAIN


def is_our_context(node: dict) -> bool:
    return is_context_node(node) and node.get("attributes", {}).get("source") == EP_NAME


# -- writing ---------------------------------------------------------------------------------------
def _program_bytes(prog: Program, metadata: dict) -> bytes:
    fd, tmp = tempfile.mkstemp(suffix=".mxr")
    os.close(fd)
    try:
        mxr.save(prog, tmp, metadata=metadata)
        with open(tmp, "rb") as f:
            return f.read()
    finally:
        os.unlink(tmp)


def _mxr_path(session: dict[str, str], model_path: str, partition: str) -> tuple[str, str]:
    """(absolute path to write, name relative to the EPContext model) of a partition's ``.mxr``."""
    out = session.get("ep.context_file_path", "")
    if not out and model_path:
        stem, _ = os.path.splitext(model_path)
        out = stem + "_ctx.onnx"  # where ORT writes the EPContext model by default
    if not out:
        raise EpContextError(
            f"{partition}: ep.context_embed_mode=0 writes the program to a .mxr beside the EPContext "
            "model, but neither the output path (ep.context_file_path) nor the input model's path is "
            "known: compile to a file, or embed the program (embed_compiled_data_into_model=True)"
        )
    stem = os.path.splitext(os.path.basename(out))[0]
    name = f"{stem}_{re.sub(r'[^A-Za-z0-9_.-]', '_', partition)}.mxr"
    return os.path.join(os.path.dirname(os.path.abspath(out)), name), name


def context_node(
    compiled: CompiledSubgraph, partition: str, options: EpOptions, target: str, session: dict[str, str]
) -> dict[str, Any]:
    """The EPContext node (for bridge.ep_context) replacing ``compiled``'s fused node."""
    if len(compiled.programs) != 1 or compiled.value_inputs:
        why = (
            "input values it specialises on are only known at Run"
            if compiled.value_inputs
            else f"it holds {len(compiled.programs)} programs (dims {list(compiled.programs) or 'unknown'})"
        )
        raise EpContextError(
            f"{partition}: an EPContext node holds one program compiled for static input dims, but {why}. "
            "Give the model's inputs fixed dims (e.g. python -m onnxruntime.tools.make_dynamic_shape_fixed) "
            "and leave migraphx_max_dynamic_batch unset to compile it ahead of time"
        )
    ((dims, prog),) = compiled.programs.items()
    weights = set(compiled.graph.get("initializers", {}))
    inputs = [n for n in compiled.input_names if n not in weights]  # weights live in the program
    values = compiled.graph.get("values", {})
    record = {
        "version": RECORD_VERSION,
        "package_version": package_version(),
        "target": target,
        "options": options_record(options, target),
        "partition": partition,
        "inputs": inputs,
        "input_types": [values[n]["dtype"] for n in inputs],
        "input_dims": [list(dims[compiled.input_names.index(n)]) for n in inputs],
        "outputs": list(compiled.output_names),
    }
    data = _program_bytes(prog, {"subgraph": partition, "epcontext": record})
    embed = session.get("ep.context_embed_mode", "0").strip() == "1"
    if embed:
        payload: str | bytes = data
    else:
        path, payload = _mxr_path(session, compiled.graph.get("model_path", ""), partition)
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError as e:
            raise EpContextError(f"{partition}: cannot write {path}: {e.strerror or e}") from None
    info = session_info(options, target)
    attributes: dict[str, Any] = {
        "main_context": 1,
        "embed_mode": int(embed),
        "ep_cache_context": payload,
        "ep_sdk_version": package_version(),
        "hardware_architecture": f"gpu:{info.arch}" if info.arch else target,
        "partition_name": partition,
        "source": EP_NAME,
    }
    model_path = compiled.graph.get("model_path", "")
    if model_path:
        # ORT's attribute for the original model: a file name, looked up beside the EPContext model to
        # recompile a partition whose program cannot run (another version, options or target).
        attributes["onnx_model_filename"] = os.path.basename(model_path)
    # ORT matches EPContext nodes to fused nodes by name (a plugin EP cannot apply
    # ep.context_node_name_prefix: ORT names the fused nodes).
    return {
        "name": partition,
        "inputs": inputs,
        "outputs": list(compiled.output_names),
        "attributes": attributes,
    }


# -- loading ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def _payload_file(node: dict, model_path: str, label: str) -> Iterator[tuple[str, str]]:
    """(path of the node's .mxr, how to name it in messages); an embedded one in a temporary file."""
    attrs = node.get("attributes", {})
    if attrs.get("main_context", 1) != 1:
        raise EpContextError(f"{label}: main_context=0 (a context shared with another node) is not supported")
    embed = attrs.get("embed_mode", 1)
    blob = attrs.get("ep_cache_context")
    if embed not in (0, 1) or blob is None:
        raise EpContextError(f"{label}: needs ep_cache_context and embed_mode 0 or 1 (got {embed!r})")
    data = blob.encode("utf-8", "surrogateescape") if isinstance(blob, str) else bytes(blob)
    if embed == 0:
        try:
            path = beside_model(model_path, data.decode("utf-8", "replace"))
        except NotBeside as e:
            raise EpContextError(f"{label}: ep_cache_context {e}") from None
        yield path, path
        return
    fd, tmp = tempfile.mkstemp(suffix=".mxr")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield tmp, "embedded program"
    finally:
        os.unlink(tmp)


def _mismatches(record: Any, options: EpOptions, target: str) -> list[str]:
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return ["it holds no EPContext record of this format (not written by this EP's EPContext writer)"]
    lacking = [k for k in ("inputs", "input_types", "input_dims", "outputs", "options") if k not in record]
    if lacking:
        return [f"its EPContext record lacks {', '.join(lacking)}"]
    found: list[str] = []
    if record.get("package_version") != package_version():
        found.append(f"made by migraphx-ep {record.get('package_version')}, this is {package_version()}")
    if record.get("target") != target:
        found.append(f"compiled for target {record.get('target')!r}, this session's target is {target!r}")
    want, have = record["options"], options_record(options, target)
    for k in sorted(set(want) | set(have)):
        if want.get(k) != have.get(k):
            found.append(f"compiled with option {k}={want.get(k)!r}, this session has {k}={have.get(k)!r}")
    return found


def _check_io(graph: dict, record: dict, label: str) -> None:
    inputs, outputs = list(graph["inputs"]), list(graph["outputs"])
    # ORT lists a fused node's inputs and outputs in its own order, which need not be the EPContext
    # node's (nor the one the program was compiled with): the same names in any order are fine.
    if sorted(inputs) != sorted(record["inputs"]) or sorted(outputs) != sorted(record["outputs"]):
        raise EpContextError(
            f"{label}: inputs {inputs} / outputs {outputs} differ from those its program was compiled "
            f"for ({record['inputs']} / {record['outputs']})"
        )
    for n, t in zip(record["inputs"], record["input_types"], strict=True):
        have = graph.get("values", {}).get(n, {}).get("dtype")
        if have != t:
            raise EpContextError(
                f"{label}: input {n!r} is {elem_type_name(have or 0)}, its program takes {elem_type_name(t)}"
            )


class _Reordered(CompiledSubgraph):
    """A loaded program whose outputs the fused node lists in another order: results are handed back in
    the fused node's order. (Inputs need nothing: programs take them by name.) The shell's native Run
    path would copy outputs in the program's order, so it is not offered."""

    def __init__(self, order: list[int], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order = order  # fused node output i is program output order[i]

    def run(self, inputs: list[Any]) -> list[Any]:
        outs = super().run(inputs)
        return [outs[i] for i in self.order]

    def native_plan(self, inputs: list[Any]) -> None:
        return None


def load_context(
    graph: dict,
    name: str,
    options: EpOptions,
    target: str,
    recompile: Callable[[dict], CompiledSubgraph] | None = None,
) -> CompiledSubgraph:
    """A CompiledSubgraph running the EPContext node of ``graph`` (its only node), compiling nothing.
    What the program was made for is checked from the file's metadata before the program is loaded.
    A program made for something else is not run: ``recompile`` compiles the partition's nodes taken
    from the original model (a graph dict as Compile gets one) when that model is beside this one."""
    node = graph["nodes"][0]
    label = f"EPContext node {node.get('name', '')!r}"
    try:
        return _load(graph, name, options, target, label)
    except ContextMismatch as e:
        problem = str(e)
    try:
        if recompile is None:
            raise SourceUnavailable("this backend cannot recompile it")
        source = original_subgraph(graph)
    except SourceUnavailable as e:
        raise EpContextError(
            f"{label} cannot run here: {problem}. It cannot be recompiled: {e}. Compile the original "
            "model again with this session's options, or load that model instead"
        ) from None
    log.warning(
        "%s: %s cannot run here: %s; recompiling its partition from the original model %s (compile that "
        "model again to load without compiling)",
        EP_NAME,
        label,
        problem,
        source["model_path"],
    )
    return recompile(source)


def _load(graph: dict, name: str, options: EpOptions, target: str, label: str) -> CompiledSubgraph:
    attrs = graph["nodes"][0].get("attributes", {})
    if attrs.get("ep_sdk_version", package_version()) != package_version():
        raise ContextMismatch(f"made by migraphx-ep {attrs['ep_sdk_version']}, this is {package_version()}")
    with _payload_file(graph["nodes"][0], graph.get("model_path", ""), label) as (path, where):
        try:
            record = mxr.read_metadata(path).get("epcontext")
            problems = _mismatches(record, options, target)
            if problems:
                raise ContextMismatch(f"{'; '.join(problems)} ({where})")
            _check_io(graph, record, label)
            prog = mxr.load_file(path).program
        except mxr.MxrError as e:
            # A temporary file's name means nothing to the user: an embedded program is named as such.
            problem = str(e) if path == where else f"{where}: {str(e).split(': ', 1)[-1]}"
            raise EpContextError(f"{label}: {problem}") from None
    if prog is None or not prog.is_compiled():
        raise EpContextError(f"{label} ({where}) holds no compiled program")
    dims = dict(zip(record["inputs"], record["input_dims"], strict=True))
    key: ShapeKey = tuple(tuple(dims[n]) for n in graph["inputs"])
    if list(graph["outputs"]) == record["outputs"]:
        return CompiledSubgraph(graph, name, options, _no_compile, None, target, programs={key: prog})
    order = [record["outputs"].index(n) for n in graph["outputs"]]
    return _Reordered(order, graph, name, options, _no_compile, None, target, programs={key: prog})


def _no_compile(*_: Any) -> None:  # pragma: no cover - a context subgraph never compiles
    raise EpContextError("an EPContext node compiles nothing")


__all__ = ["EpContextError", "context_node", "is_context_node", "is_our_context", "load_context"]
