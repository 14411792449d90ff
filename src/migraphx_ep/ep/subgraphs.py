"""Control-flow bodies as ORT hands them to GetCapability and Compile.

ORT partitions bottom-up: it offers an If/Loop/Scan body to the EP (and compiles what the EP claims
there) *before* it offers the graph holding the control-flow node. Two consequences:

- A body reads values of the enclosing graph that are neither its inputs nor its initializers (MIGraphX's
  ONNX parser passes them in as the outer scope). Offered on its own, such a body must treat them as
  inputs: ORT feeds them to the fused node like any other input.
- By the time the enclosing graph is offered, the body may hold fused nodes of ours. They are expanded
  back into the nodes we compiled them from, so the control-flow node can still be claimed whole.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..frontend.subgraph import free_names

EP_NAME = "MIGraphXExecutionProvider"


def with_outer_scope_inputs(graph: dict) -> tuple[dict, dict[int, str]]:
    """``graph`` with every outer-scope value it reads (typed, not produced here) as a graph input, and
    the nodes to refuse: those reading an outer-scope value only through a subgraph of their own. ORT
    before 1.32 leaves such implicit inputs off the fused node, so the value would not reach Compute;
    left alone, they are claimed with the enclosing graph's control-flow node instead."""
    values = graph.get("values", {})
    known = set(graph.get("inputs", ()))
    outer = [n for n in free_names(graph) if n not in known and (values.get(n) or {}).get("dtype")]
    if not outer:
        return graph, {}
    refuse = {}
    for node in graph["nodes"]:
        hidden = sorted((set(node.get("implicit_inputs", ())) & set(outer)) - set(node["inputs"]))
        if hidden:
            refuse[node["index"]] = f"its subgraph reads {hidden[0]!r} of an enclosing graph"
    return {**graph, "inputs": [*graph.get("inputs", ()), *outer]}, refuse


def is_ours(node: dict) -> bool:
    """A node this EP fused in an earlier partitioning round (its domain is the EP's name)."""
    return node.get("domain") == EP_NAME


def expand_fused(graph: dict, fused: dict[str, dict]) -> dict:
    """``graph`` with our fused nodes inside control-flow bodies replaced by the nodes they came from.

    ``fused`` maps a fused node's name to the graph dict its Compile received. Nodes of the top level
    are kept: ORT has assigned them already, so they can only be refused there."""
    if not fused or not any(n.get("subgraphs") for n in graph["nodes"]):
        return graph
    nodes = [_expand_bodies(n, fused) for n in graph["nodes"]]
    return {**graph, "nodes": nodes}


def _expand_bodies(node: dict, fused: dict[str, dict]) -> dict:
    subs = node.get("subgraphs") or {}
    if not subs:
        return node
    return {**node, "subgraphs": {attr: _expand_body(body, fused) for attr, body in subs.items()}}


def _expand_body(body: dict, fused: dict[str, dict]) -> dict:
    nodes: list[dict] = []
    values = dict(body.get("values", {}))
    inits = dict(body.get("initializers", {}))
    changed = False
    for node in body["nodes"]:
        inner = fused.get(node.get("name", "")) if is_ours(node) else None
        if inner is None:
            expanded = _expand_bodies(node, fused)
            changed |= expanded is not node
            nodes.append(expanded)
            continue
        changed = True
        nodes.extend(_expand_bodies(n, fused) for n in inner["nodes"])
        for name, info in inner.get("values", {}).items():
            values.setdefault(name, info)
        for name, arr in inner.get("initializers", {}).items():
            # Copies: the views Compile took are tied to the inner fused node's lifetime.
            inits.setdefault(name, _owned(arr))
    if not changed:
        return body
    renumbered = [{**n, "index": i} for i, n in enumerate(nodes)]
    return {**body, "nodes": renumbered, "values": values, "initializers": inits}


def _owned(arr: Any) -> Any:
    return np.array(arr, copy=True) if isinstance(arr, np.ndarray) else arr
