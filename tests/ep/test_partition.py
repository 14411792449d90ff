"""Partitioning: claimed groups are convex, maximal, and respect what the frontend can compile."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h

from migraphx_ep.ep.partition import convex_groups, partition
from migraphx_ep.frontend import model_to_dict


def nodes(*edges: tuple[list[str], list[str]]) -> list[dict]:
    return [{"index": i, "inputs": ins, "outputs": outs} for i, (ins, outs) in enumerate(edges)]


def is_convex(ns: list[dict], group: list[int]) -> bool:
    """Brute force: no node outside the group is both reachable from and reaching into it."""
    produced = {o: n["index"] for n in ns for o in n["outputs"]}
    succ: dict[int, set[int]] = {n["index"]: set() for n in ns}
    for n in ns:
        for i in n["inputs"]:
            if i in produced:
                succ[produced[i]].add(n["index"])

    def reach(start: set[int]) -> set[int]:
        seen, todo = set(), list(start)
        while todo:
            x = todo.pop()
            for y in succ[x]:
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return seen

    g = set(group)
    below = reach(g)
    return all(not (reach({x}) & g) for x in below - g)


def test_unsupported_in_middle_splits_group():
    # a -> b(unsupported) -> c, and a -> c directly: {a, c} would not be convex
    ns = nodes((["x"], ["a"]), (["a"], ["b"]), (["a", "b"], ["c"]), (["c"], ["d"]))
    groups = convex_groups(ns, {0, 2, 3})
    assert groups == [[0], [2, 3]]
    assert all(is_convex(ns, g) for g in groups)


def test_everything_supported_is_one_group():
    ns = nodes((["x"], ["a"]), (["a"], ["b"]), (["a", "b"], ["c"]), (["c"], ["d"]))
    assert convex_groups(ns, {0, 1, 2, 3}) == [[0, 1, 2, 3]]


def test_independent_branches_merge_when_convex():
    # two parallel chains joined at the end: all supported -> one group
    ns = nodes((["x"], ["a"]), (["x"], ["b"]), (["a"], ["c"]), (["b"], ["d"]), (["c", "d"], ["e"]))
    assert convex_groups(ns, set(range(5))) == [[0, 1, 2, 3, 4]] or len(convex_groups(ns, set(range(5)))) == 1


def test_random_dags_always_convex():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 14))
        ns = []
        for i in range(n):
            k = int(rng.integers(0, min(i, 3) + 1))
            srcs = [f"v{j}" for j in rng.choice(i, size=k, replace=False)] if i and k else ["x"]
            ns.append({"index": i, "inputs": srcs, "outputs": [f"v{i}"]})
        supported = {i for i in range(n) if rng.random() < 0.7}
        groups = convex_groups(ns, supported)
        claimed = [i for g in groups for i in g]
        assert sorted(claimed) == sorted(supported)  # every supported node is claimed exactly once
        for g in groups:
            assert is_convex(ns, g), (ns, supported, groups)


def _model(nodes_, inputs, outputs, inits=(), vis=()):
    g = h.make_graph(nodes_, "g", inputs, outputs, list(inits), value_info=list(vis))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_partition_refuses_unknown_op_with_reason():
    m = _model(
        [
            h.make_node("Relu", ["x"], ["a"]),
            h.make_node("NotAnOp", ["a"], ["b"], domain="custom"),
            h.make_node("Relu", ["b"], ["y"]),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 4])],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", 4])],
        vis=[h.make_tensor_value_info("b", T.FLOAT, ["N", 4])],
    )
    p = partition(model_to_dict(m))
    assert p.groups == [[0], [2]]
    assert "no parser for custom::NotAnOp" in p.refused[1]


def test_partition_refuses_string_tensors():
    m = _model(
        [h.make_node("Identity", ["s"], ["t"])],
        [h.make_tensor_value_info("s", T.STRING, [2])],
        [h.make_tensor_value_info("t", T.STRING, [2])],
    )
    p = partition(model_to_dict(m))
    assert p.groups == [] and "unsupported ONNX element type 8" in p.refused[0]


def _model_graphs() -> list[tuple[str, dict]]:
    import glob
    import os

    import onnx

    here = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models")
    return [(os.path.basename(p), model_to_dict(onnx.load(p))) for p in sorted(glob.glob(f"{here}/*.onnx"))]


def test_a_graph_claimed_whole_is_probed_once_and_the_skipped_probe_would_refuse_nothing(monkeypatch):
    # partition() skips the group-aware re-probe when the first probe refused nothing and every node
    # forms one group: the skipped probe, run here, must refuse nothing, for the ref target (no veto)
    # and with the gpu target's veto.
    import functools

    from migraphx_ep.ep import partition as part
    from migraphx_ep.targets.gpu.support import instruction_supported

    calls: list[dict] = []
    real = part.probe_parse

    def counted(graph, **kw):
        calls.append(kw)
        return real(graph, **kw)

    monkeypatch.setattr(part, "probe_parse", counted)
    whole = 0
    for name, g in [*_model_graphs(), ("value inputs", _value_input_graph())]:
        for check in (None, functools.partial(instruction_supported, cc=(9, 0))):
            calls.clear()
            p = partition(g, check)
            if p.refused or len(p.groups) != 1:
                continue
            whole += 1
            assert len(calls) == 1, f"{name}: {len(calls)} probes for a graph claimed whole"
            group_of = {i: 0 for i in p.groups[0]}
            again, _ = part._probe(
                g, {}, claimed=set(group_of), group_of=group_of, specialize=True, check=check
            )
            assert again == {}, f"{name}: the skipped probe refuses {again}"
            # What the compile takes from the partition instead of parsing again (ep/compiled.py):
            # its own parse, without the gpu target's check, finds the same value inputs.
            assert p.needs_values == real(g, specialize=True).needs_values, name
    assert whole >= 12, whole  # the shipped models and the value-input graph, claimed whole on both targets


def _value_input_graph() -> dict:
    """A ReduceSum whose axes and a Reshape whose shape are graph inputs: the probe finds both needed by
    value."""
    g = h.make_graph(
        [
            h.make_node("Reshape", ["x", "shape"], ["y"]),
            h.make_node("ReduceSum", ["y", "axes"], ["r"], keepdims=1),
        ],
        "g",
        [
            h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4]),
            h.make_tensor_value_info("axes", T.INT64, [1]),
            h.make_tensor_value_info("shape", T.INT64, [2]),
        ],
        [h.make_tensor_value_info("r", T.FLOAT, None)],
    )
    out = model_to_dict(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]))
    assert sorted(n for v in partition(out).needs_values.values() for n in v) == ["axes", "shape"]
    return out


def test_a_graph_with_refusals_is_still_probed_by_group(monkeypatch):
    from migraphx_ep.ep import partition as part

    calls: list[dict] = []
    real = part.probe_parse
    monkeypatch.setattr(part, "probe_parse", lambda graph, **kw: calls.append(kw) or real(graph, **kw))
    g = model_to_dict(
        h.make_model(
            h.make_graph(
                [
                    h.make_node("Relu", ["x"], ["a"]),
                    h.make_node("NoSuchOp", ["a"], ["b"], domain="example.com"),
                    h.make_node("Neg", ["x"], ["c"]),
                ],
                "g",
                [h.make_tensor_value_info("x", T.FLOAT, [2])],
                [h.make_tensor_value_info(n, T.FLOAT, [2]) for n in ("b", "c")],
            ),
            opset_imports=[h.make_opsetid("", 17), h.make_opsetid("example.com", 1)],
        )
    )
    p = partition(g)
    assert p.groups == [[0], [2]] and 1 in p.refused
    assert any("group_of" in kw for kw in calls), "the group-aware probe did not run"


def test_bits_lists_the_set_positions():
    from migraphx_ep.ep.partition import _bits

    assert list(_bits(0)) == [] and list(_bits(1)) == [0]
    mask = (1 << 0) | (1 << 5) | (1 << 64) | (1 << 1000)  # beyond one machine word
    assert list(_bits(mask)) == [0, 5, 64, 1000]
