"""An EPContext node's partition, taken back from the original model, to recompile it.

The node names the original model (ORT's ``onnx_model_filename`` attribute, a file beside the EPContext
model) and its partition's boundary: its inputs and outputs. The nodes that compute those outputs from
those inputs and the original's initializers are the partition (whatever ORT's own graph optimisations
made of it before we compiled it: they keep values' meanings). Anything else the outputs need, an input
the node does not take, means the boundary is not one of the original's and nothing is recompiled.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from ..frontend.graph import graph_to_dict

if TYPE_CHECKING:  # imported where used: only a recompile from the original model needs onnx
    import onnx


class SourceUnavailable(ValueError):
    """The node's partition cannot be taken from an original model (the message says why)."""


class NotBeside(ValueError):
    """A file an EPContext node names that we may not, or cannot, look for beside the model."""


def beside_model(model_path: str, name: str) -> str:
    """The path of file ``name`` in the directory of the model at ``model_path``."""
    # Only a file beside the model (or below it): a model must not make us read any path it likes.
    if os.path.isabs(name) or ".." in re.split(r"[\\/]", name) or not name or "\0" in name:
        raise NotBeside(f"{name!r} must be a relative path inside the model's directory")
    if not model_path:
        raise NotBeside(
            f"{name!r} is beside the model, but the model was loaded from bytes, so its directory is "
            "unknown: load it from its file"
        )
    return os.path.join(os.path.dirname(os.path.abspath(model_path)), name)


def original_subgraph(graph: dict) -> dict:
    """The Compile graph dict of the partition behind ``graph``'s EPContext node, from the original
    model (``onnx_model_filename``, beside the EPContext model)."""
    import onnx
    from onnx import helper

    name = graph["nodes"][0].get("attributes", {}).get("onnx_model_filename")
    if not isinstance(name, str) or not name:
        raise SourceUnavailable("the node names no original model (onnx_model_filename)")
    try:
        path = beside_model(graph.get("model_path", ""), name)
    except NotBeside as e:
        raise SourceUnavailable(f"the original model {e}") from None
    if not os.path.isfile(path):
        raise SourceUnavailable(f"the original model {name!r} is not beside it ({path})")
    unreadable = f"the original model {path} cannot be read"
    try:
        # External data stays on disk: graph_to_dict reads only the weights the partition uses.
        model = onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises several unrelated types on a bad file
        raise SourceUnavailable(f"{unreadable} ({type(e).__name__}: {e})") from None
    inputs, outputs = list(graph["inputs"]), list(graph["outputs"])
    nodes, weights = _partition(model.graph, inputs, outputs, path)
    values = graph.get("values", {})

    def declared(n: str) -> onnx.ValueInfoProto:
        v = values.get(n) or {}
        return helper.make_tensor_value_info(n, int(v.get("dtype") or 0), v.get("shape"))

    sub = helper.make_graph(
        nodes,
        model.graph.name or "partition",
        [declared(n) for n in inputs],
        [declared(n) for n in outputs],
        [t for t in model.graph.initializer if t.name in weights],
    )
    try:  # types of the values inside, as model_to_dict has them (a convenience: parsing infers too)
        sub = onnx.shape_inference.infer_shapes(helper.make_model(sub, opset_import=model.opset_import)).graph
    except Exception:  # noqa: BLE001, S110
        pass
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    try:
        d = graph_to_dict(sub, opsets, os.path.dirname(path))
    except Exception as e:  # noqa: BLE001 - e.g. an external weight file that is gone
        raise SourceUnavailable(f"{unreadable} ({type(e).__name__}: {e})") from None
    # The inputs in the fused node's order (graph_to_dict keeps it), dims as the EPContext model declares.
    d["values"].update({n: dict(values[n]) for n in inputs + outputs if n in values})
    return {**d, "model_path": path, "is_subgraph": False}


def _partition(
    g: onnx.GraphProto, inputs: list[str], outputs: list[str], path: str
) -> tuple[list[onnx.NodeProto], set[str]]:
    """The original's nodes computing ``outputs`` from ``inputs`` and initializers (in its order), and
    the initializers they read."""
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    initializers = {t.name for t in g.initializer}
    stop = set(inputs)
    keep: set[int] = set()
    weights: set[str] = set()
    seen: set[str] = set()
    todo = list(outputs)
    while todo:
        v = todo.pop()
        if not v or v in seen or v in stop:
            continue
        seen.add(v)
        if v in producer:
            i = producer[v]
            if i not in keep:
                keep.add(i)
                todo.extend(g.node[i].input)
                todo.extend(_outer_names(g.node[i]))
        elif v in initializers:
            weights.add(v)
        else:
            raise SourceUnavailable(
                f"in the original model {path}, {v!r} is not computed from the node's inputs {inputs}"
            )
    return [n for i, n in enumerate(g.node) if i in keep], weights


def _outer_names(node: onnx.NodeProto) -> set[str]:
    """Values of the enclosing graph that ``node``'s subgraphs (If/Loop/Scan bodies) read."""
    import onnx

    names: set[str] = set()
    for a in node.attribute:
        for body in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            defined = {i.name for i in body.input} | {t.name for t in body.initializer}
            defined |= {o for n in body.node for o in n.output}
            for n in body.node:
                names |= {x for x in n.input if x and x not in defined}
                names |= _outer_names(n) - defined
            names |= {o.name for o in body.output if o.name not in defined}
    return names


__all__ = ["NotBeside", "SourceUnavailable", "beside_model", "original_subgraph"]
