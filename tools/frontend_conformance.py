"""ONNX node test cases straight through the frontend + ref target (no ORT, no native build).

A developer tool for op work: how many cases parse, and of those how many match ONNX's expected
outputs. The EP-level conformance (through ORT) is ``python -m migraphx_ep.conformance``.

    python tools/frontend_conformance.py [--ops Add,Sub] [--show-refused] [--show-wrong]
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings

import numpy as np
import onnx
from onnx.backend.test.case.node import collect_testcases

from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.shape import Shape


def as_array(x):
    if isinstance(x, onnx.TensorProto):
        return onnx.numpy_helper.to_array(x)
    if x is None or isinstance(x, list):
        return None
    return np.asarray(x)


def close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str | None:
    got = np.asarray(got)
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if want.dtype.kind in "fc" or want.dtype.name in ("bfloat16",) or "float8" in want.dtype.name:
        g, w = got.astype(np.float64), want.astype(np.float64)
        if not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
            return f"max abs err {np.nanmax(np.abs(g - w)) if g.size else 0}"
        return None
    return None if np.array_equal(got, want) else "values differ"


def run_case(case) -> tuple[str, str]:
    d = model_to_dict(case.model)
    inputs_ds, outputs_ds = case.data_sets[0]
    ins = [as_array(x) for x in inputs_ds]
    outs = [as_array(x) for x in outputs_ds]
    if any(x is None for x in ins + outs):
        return "skip", "non-tensor inputs/outputs"
    names = d["inputs"]
    if len(names) != len(ins):
        names = [n for n in [i.name for i in case.model.graph.input]][: len(ins)]
    feeds = dict(zip(names, ins, strict=False))
    try:
        shapes = {k: Shape(from_numpy(v.dtype), v.shape) for k, v in feeds.items()}
        prog = parse_graph(d, shapes).program
    except Exception as e:  # noqa: BLE001
        return "refused", f"{type(e).__name__}: {e}"
    for inputs_ds, outputs_ds in case.data_sets:
        feeds = dict(zip(names, [as_array(x) for x in inputs_ds], strict=False))
        try:
            got = prog.run_numpy(feeds)
        except Exception as e:  # noqa: BLE001
            return "wrong", f"run failed {type(e).__name__}: {e}"
        for g, w in zip(got, [as_array(x) for x in outputs_ds], strict=False):
            why = close(g, w, case.rtol, case.atol)
            if why:
                return "wrong", why
    return "correct", ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="", help="comma list of ONNX op types (default: all)")
    ap.add_argument("--filter", default="", help="substring of the test name")
    ap.add_argument("--show-refused", action="store_true")
    ap.add_argument("--show-wrong", action="store_true")
    a = ap.parse_args(argv)
    wanted = {o.strip() for o in a.ops.split(",") if o.strip()}
    warnings.simplefilter("ignore")
    counts: collections.Counter = collections.Counter()
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case in collect_testcases(None):
        if case.kind != "node":
            continue
        op = case.model.graph.node[0].op_type if case.model.graph.node else "?"
        if wanted and not ({n.op_type for n in case.model.graph.node} & wanted):
            continue
        if a.filter and a.filter not in case.name:
            continue
        status, why = run_case(case)
        counts[status] += 1
        per_op[op][status] += 1
        if (status == "refused" and a.show_refused) or (status == "wrong" and a.show_wrong):
            print(f"{status:8} {case.name}: {why}")
    for op in sorted(per_op):
        c = per_op[op]
        print(
            f"{op:32} correct {c['correct']:3}  wrong {c['wrong']:3}  "
            f"refused {c['refused']:3}  skip {c['skip']}"
        )
    print(
        f"TOTAL correct {counts['correct']} wrong {counts['wrong']} "
        f"refused {counts['refused']} skip {counts['skip']}"
    )
    return 1 if counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
