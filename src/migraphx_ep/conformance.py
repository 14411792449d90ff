"""ONNX's node test cases through ORT with the EP: claimed-correct / claimed-wrong / refused.

    python -m migraphx_ep.conformance [--ops Add,Conv] [--filter text] [--show wrong,refused,partial]
                                      [--json out.json] [--target ref|gpu|auto] [--shard K/N]

Denominator: cases the *installed* ORT's own CPU EP can load and run (a model whose IR version ORT
rejects is re-saved at IR 11; TensorProto / numpy-scalar inputs become arrays), so it grows as ORT
learns new ops. Placement comes from ORT's profiler: a case is *claimed* when every node event names
our provider, *partial* when some do. The EP's session runs with ORT's graph optimisations off, so the
node under test reaches the EP as ONNX wrote it (with them on, ORT constant-folds e.g. a lone Shape and
no provider runs anything).

Exit status: 0 when nothing is claimed-wrong and every ep-error is one of KNOWN_RUN_TIME_REFUSALS
(documented value-dependent refusals), 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import onnx

EP = "MIGraphXExecutionProvider"

# Value-dependent refusals found only at Run: the node needs an input's *value* (specialised at Run),
# and for these values the compiler refuses (ORT and ONNX's reference disagree there). The session
# then fails with an error naming node and reason - never a wrong number. A new one is a failure.
KNOWN_RUN_TIME_REFUSALS = frozenset(
    {
        "test_maxunpool_export_with_output_shape",
        "test_resize_downsample_scales_linear_align_corners",
        "test_resize_downsample_scales_cubic_align_corners",
    }
)


@dataclass
class CaseResult:
    name: str
    op: str
    # claimed-correct, claimed-wrong, partial-correct, refused, ep-error, not-runnable, or
    # as-ort-cpu: differs from ONNX's expected output beyond its tolerance exactly as ORT's own CPU EP does
    status: str
    detail: str = ""


def _array(x):
    if isinstance(x, onnx.TensorProto):
        return onnx.numpy_helper.to_array(x)
    if isinstance(x, np.ndarray | np.generic):
        return np.asarray(x)
    return None  # sequences, optionals, None: not tensors


def _mismatch(got, want: np.ndarray, rtol: float, atol: float) -> str | None:
    got = np.asarray(got)
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if want.dtype.kind == "f" or want.dtype.name == "bfloat16" or "float8" in want.dtype.name:
        g, w = got.astype(np.float64), want.astype(np.float64)
        if not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
            return f"max abs err {np.nanmax(np.abs(g - w)) if g.size else 0:.3g}"
        return None
    if want.dtype.kind in "OUS":
        return None if list(got.ravel()) == list(want.ravel()) else "values differ"
    return None if np.array_equal(got, want) else "values differ"


def _session(ort, model_bytes: bytes, providers: list, profile_dir: str | None):
    so = ort.SessionOptions()
    so.log_severity_level = 4
    if profile_dir:  # the EP's session, profiled for placement
        # ...and unoptimised, so the node under test reaches the EP instead of being folded by ORT
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "p")
    return ort.InferenceSession(model_bytes, so, providers=providers)


def _placement(sess) -> collections.Counter:
    path = sess.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.unlink(path)
    return collections.Counter(
        e["args"].get("provider", "?")
        for e in events
        if e.get("cat") == "Node" and "provider" in e.get("args", {})
    )


def run_case(ort, case, tmp: str, ep_options: dict[str, str] | None = None) -> CaseResult:
    op = case.model.graph.node[0].op_type if case.model.graph.node else "?"
    model = case.model
    data = [([_array(x) for x in i], [_array(x) for x in o]) for i, o in case.data_sets]
    if any(a is None for ins, outs in data for a in ins + outs):
        return CaseResult(case.name, op, "not-runnable", "non-tensor inputs or outputs")
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    feeds_list = [dict(zip(names, ins, strict=False)) for ins, _ in data]
    try:
        mb = model.SerializeToString()
        cpu = _session(ort, mb, ["CPUExecutionProvider"], None)
    except Exception:  # noqa: BLE001 - ORT rejects some IR versions: re-save at IR 11 and retry
        try:
            model = onnx.ModelProto()
            model.CopyFrom(case.model)
            model.ir_version = 11
            mb = model.SerializeToString()
            cpu = _session(ort, mb, ["CPUExecutionProvider"], None)
        except Exception as e:  # noqa: BLE001
            return CaseResult(case.name, op, "not-runnable", f"ORT CPU cannot load: {str(e)[:120]}")
    try:
        cpu_results = [cpu.run(None, feeds) for feeds in feeds_list]
    except Exception as e:  # noqa: BLE001
        return CaseResult(case.name, op, "not-runnable", f"ORT CPU cannot run: {str(e)[:120]}")
    try:
        ep = (EP, ep_options) if ep_options else EP
        sess = _session(ort, mb, [ep, "CPUExecutionProvider"], tmp)
        results = [sess.run(None, feeds) for feeds in feeds_list]
    except Exception as e:  # noqa: BLE001 - our EP broke a model ORT can run: that is our fault
        return CaseResult(case.name, op, "ep-error", str(e).splitlines()[0][:300])
    placed = _placement(sess)
    ours, total = placed.get(EP, 0), sum(placed.values())
    wrong = as_cpu = None
    for got_all, (_, want_all), cpu_all in zip(results, data, cpu_results, strict=True):
        for g, w, c in zip(got_all, want_all, cpu_all, strict=False):
            why = _mismatch(g, w, case.rtol, case.atol)
            if why and _mismatch(c, w, case.rtol, case.atol) and not _mismatch(g, c, case.rtol, case.atol):
                as_cpu = as_cpu or f"{why} from ONNX's expected output; ORT's CPU EP gives the same"
            elif why:
                wrong = wrong or why
    if ours == 0:
        return CaseResult(case.name, op, "refused", _refusal_reason(model))
    if wrong:
        return CaseResult(case.name, op, "claimed-wrong", wrong)
    if as_cpu:
        return CaseResult(case.name, op, "as-ort-cpu", as_cpu)
    return CaseResult(
        case.name,
        op,
        "claimed-correct" if ours == total else "partial-correct",
        "" if ours == total else f"{ours}/{total} node events on {EP}",
    )


def _refusal_reason(model: onnx.ModelProto) -> str:
    from .ep.partition import partition
    from .frontend import model_to_dict

    try:
        part = partition(model_to_dict(model))
    except Exception as e:  # noqa: BLE001
        return f"partition failed: {e}"
    return "; ".join(sorted(set(part.refused.values())))[:300] or "not claimed by ORT"


def _shard(text: str) -> tuple[int, int]:
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"expected K/N with 0 <= K < N, got {text!r}")
    return int(k), int(n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m migraphx_ep.conformance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--ops", default="", help="comma list of ONNX op types (default: all)")
    ap.add_argument("--filter", default="", help="substring of the test name")
    ap.add_argument(
        "--show", default="claimed-wrong,ep-error,as-ort-cpu", help="statuses to list case by case"
    )
    ap.add_argument("--json", default="", help="write every case's result here")
    ap.add_argument("--per-op", action="store_true", help="print a per-op table")
    ap.add_argument(
        "--target",
        choices=("ref", "gpu", "auto"),
        help="the EP's migraphx_target (default: the EP's own default, or ORT_MIGRAPHX_TARGET)",
    )
    ap.add_argument("--shard", type=_shard, help="K/N: only every N-th case from the K-th (parallel runs)")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import onnxruntime as ort
    from onnx.backend.test.case.node import collect_testcases

    import migraphx_ep  # noqa: F401 - registers the EP and routes its name

    wanted = {o for o in a.ops.split(",") if o}
    show = {s for s in a.show.split(",") if s}
    ep_options = {"migraphx_target": a.target} if a.target else None
    results: list[CaseResult] = []
    t0 = time.time()
    cases = [c for c in collect_testcases(None) if c.kind == "node"]
    with tempfile.TemporaryDirectory() as tmp:
        for n, case in enumerate(cases):
            if wanted and not ({x.op_type for x in case.model.graph.node} & wanted):
                continue
            if a.filter and a.filter not in case.name:
                continue
            if a.shard and n % a.shard[1] != a.shard[0]:
                continue
            r = run_case(ort, case, tmp, ep_options)
            results.append(r)
            if r.status in show:
                print(f"{r.status:16} {r.name}: {r.detail}", flush=True)
            if n % 200 == 0:
                print(f"... {n}/{len(cases)} cases, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    counts = collections.Counter(r.status for r in results)
    if a.per_op:
        per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for r in results:
            per[r.op][r.status] += 1
        for op in sorted(per):
            print(f"{op:34} " + " ".join(f"{k}={v}" for k, v in sorted(per[op].items())))
    runnable = sum(v for k, v in counts.items() if k != "not-runnable")
    good = counts["claimed-correct"]
    print(
        f"cases {len(results)}, ORT-runnable {runnable}: claimed-correct {good} "
        f"({100.0 * good / max(runnable, 1):.1f}%), partial-correct {counts['partial-correct']}, "
        f"claimed-wrong {counts['claimed-wrong']}, as-ort-cpu {counts['as-ort-cpu']}, "
        f"ep-error {counts['ep-error']}, "
        f"refused {counts['refused']}, "
        f"not-runnable {counts['not-runnable']} ({time.time() - t0:.0f} s)"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"counts": dict(counts), "cases": [asdict(r) for r in results]}, f, indent=1)
    unexpected = [r.name for r in results if r.status == "ep-error" and r.name not in KNOWN_RUN_TIME_REFUSALS]
    return 1 if counts["claimed-wrong"] or unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
