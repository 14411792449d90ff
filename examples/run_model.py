"""Run an ONNX model through ONNX Runtime with MIGraphXExecutionProvider and check it against the CPU EP.

    python examples/run_model.py                    # ResNet-50 (ONNX's bundled graph, random weights)
    python examples/run_model.py --model m.onnx     # any model; inputs are random, symbolic dims = 1
    python examples/run_model.py --light squeezenet --option migraphx_fp16_enable=1

Prints where every node ran (from ORT's profiler, not from get_providers()), the largest difference
from the CPU EP, and timings. In float32 ours must match ORT's CPU EP to 1e-3. In low precision (an
fp16/bf16 model, or migraphx_fp16_enable / migraphx_bf16_enable) neither side is exact, so both are
measured against a float32 run of the model on the CPU EP: ours passes when its error is within a
small factor of the CPU EP's own error on the low-precision model, plus a few units in the last place
of the low-precision type at the size of the outputs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

import migraphx_ep
from migraphx_ep.ep.options import OptionError, parse_options
from migraphx_ep.testing import LIGHT_MODELS, light_input, light_model, random_feeds

EP = migraphx_ep.get_ep_name()
FP32_TOL = 1e-3
# Machine epsilon of each low-precision type: the spacing of values near 1.
EPS = {TensorProto.FLOAT16: float(np.finfo(np.float16).eps), TensorProto.BFLOAT16: 2.0**-7}
ULPS = 8  # accumulated rounding allowed at the outputs' magnitude (bf16 ViT needs ~2, fp16 BERT ~1)
CPU_FACTOR = 2  # ours may be this many times as far from float32 as the CPU EP is


def random_inputs(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    """Symbolic dims are 1; ids/masks 0 or 1, floats standard normal (``migraphx_ep.testing``)."""
    return random_feeds(model, lambda _axis, _name: 1, np.random.default_rng(seed))


def placement(sess: ort.InferenceSession) -> collections.Counter:
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.unlink(path)
    return collections.Counter(
        (e["args"]["provider"], e["args"].get("op_name", "?"))
        for e in events
        if e.get("cat") == "Node" and "provider" in e.get("args", {})
    )


# -- low precision: a float32 reference --------------------------------------------------------------
def _walk_graphs(g: onnx.GraphProto):
    yield g
    for n in g.node:
        for a in n.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                yield from _walk_graphs(sub)


def low_types(model: onnx.ModelProto) -> set[int]:
    """The low-precision float types (fp16, bf16) the model's tensors, values and casts use."""
    found = set()
    for g in _walk_graphs(model.graph):
        found |= {t.data_type for t in g.initializer}
        found |= {v.type.tensor_type.elem_type for v in [*g.input, *g.output, *g.value_info]}
        for n in g.node:
            found |= {a.i for a in n.attribute if a.name in ("to", "dtype") and a.type == a.INT}
            found |= {a.t.data_type for a in n.attribute if a.type == a.TENSOR}
    return found & set(EPS)


def _upcast_tensor(t: TensorProto) -> None:
    if t.data_type in EPS:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))


def upcast_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy computing in float32 wherever the model computes in fp16/bf16 (weights, I/O, casts)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for g in _walk_graphs(m.graph):
        del g.value_info[:]  # ORT infers the intermediate types again
        for t in g.initializer:
            _upcast_tensor(t)
        for v in [*g.input, *g.output]:
            if v.type.tensor_type.elem_type in EPS:
                v.type.tensor_type.elem_type = TensorProto.FLOAT
        for n in g.node:
            for a in n.attribute:
                if a.name in ("to", "dtype") and a.type == a.INT and a.i in EPS:
                    a.i = TensorProto.FLOAT
                elif a.type == a.TENSOR:
                    _upcast_tensor(a.t)
    return m


def _as_f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype in (np.float16, ml_dtypes.bfloat16) else a


def max_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest |got - want| over finite values; inf where NaN/inf positions or values disagree."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if g.size == 0:
        return 0.0
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        return float("inf")
    infinite = np.isinf(g) | np.isinf(w)
    if (g[infinite] != w[infinite]).any():
        return float("inf")
    finite = np.isfinite(g) & np.isfinite(w)
    return float(np.max(np.abs(g - w)[finite], initial=0.0))


def judge(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[bool, str]:
    """float32: ours vs the CPU EP within FP32_TOL; integer and bool outputs must be equal."""
    worst, exact_bad = 0.0, []
    for n, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return False, f"output {n}: ours {g.dtype}{list(g.shape)}, CPU EP {w.dtype}{list(w.shape)}"
        if w.dtype.kind in "biu":
            exact_bad += [str(n)] if not np.array_equal(g, w) else []
        else:
            worst = max(worst, max_error(g, w))
    ok = worst <= FP32_TOL and not exact_bad
    extra = f"; integer output(s) {', '.join(exact_bad)} differ" if exact_bad else ""
    return ok, f"max |ours - CPU EP| = {worst:.3g} (tolerance {FP32_TOL:g}){extra}"


def judge_low(
    got: list[np.ndarray], cpu: list[np.ndarray], ref: list[np.ndarray] | None, low: int
) -> tuple[bool, str]:
    """Low precision: ours and the CPU EP both against ``ref`` (a float32 run), or, for a float32
    model (``ref`` None), ours against the CPU EP, which is then exact, with the type tolerance."""
    eps, base = EPS[low], cpu if ref is None else ref
    ok, worst, lines = True, (0.0, 0.0, 0.0), []
    for n, (g, c, r) in enumerate(zip(got, cpu, base, strict=True)):
        if g.shape != c.shape or g.dtype != c.dtype:
            return False, f"output {n}: ours {g.dtype}{list(g.shape)}, CPU EP {c.dtype}{list(c.shape)}"
        if c.dtype.kind in "biu":
            same = bool(np.array_equal(g, c))
            ok &= same
            lines.append(f"  output {n}: integers {'equal to' if same else 'DIFFERENT from'} the CPU EP's")
            continue
        r = _as_f32(r)
        ours, theirs = max_error(_as_f32(g), r), (0.0 if ref is None else max_error(_as_f32(c), r))
        scale = max(1.0, float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0)))
        tol = CPU_FACTOR * theirs + ULPS * eps * scale
        ok &= ours <= tol
        worst = max(worst, (ours / tol if tol else float(ours > 0), ours, tol))
        mine = f"  output {n}: |ours - reference| {ours:.3g}"
        lines.append(
            mine
            + (f", |CPU EP - reference| {theirs:.3g}" if ref is not None else "")
            + f", tolerance {tol:.3g}"
        )
    kind = onnx.helper.tensor_dtype_to_np_dtype(low).name
    if ref is not None:
        head = (
            f"low precision ({kind}): ours and the CPU EP, against a float32 copy of the model on the CPU EP"
        )
        rule = f"{CPU_FACTOR} x the CPU EP's error + {ULPS} ulp of {kind} at the outputs' size"
    else:
        head = f"low precision ({kind} inside the EP): the CPU EP runs the float32 model"
        rule = f"{ULPS} ulp of {kind} at the outputs' size"
    summary = f"worst output: |ours - reference| = {worst[1]:.3g} (tolerance {worst[2]:.3g}: {rule})"
    return ok, "\n".join([head, *lines, summary])


def float32_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """The CPU EP on the model upcast to float32, or None (with a note saying why) if that fails."""
    try:
        up = upcast_model(model).SerializeToString()
        sess = ort.InferenceSession(up, providers=["CPUExecutionProvider"])
        return sess.run(None, {k: _as_f32(v) for k, v in feeds.items()})
    except Exception as e:  # noqa: BLE001 - judged then against the CPU EP with the type tolerance alone
        print(f"note: no float32 reference ({e}); judging against the CPU EP's low-precision result")
        return None


def option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value (e.g. migraphx_fp16_enable=1), got {text!r}")
    return key.strip(), value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="path of an ONNX model")
    ap.add_argument("--light", default="resnet50", choices=LIGHT_MODELS, help="bundled model to use")
    ap.add_argument("--option", action="append", default=[], type=option, help="provider option key=value")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    options = dict(a.option)
    try:
        ep_options = parse_options(options)  # env vars included, as the EP will read them
    except OptionError as e:
        ap.error(f"argument --option: {e}")
    if a.model:
        try:
            model, name = onnx.load(a.model), a.model
        except Exception as e:  # noqa: BLE001 - a missing file or not an ONNX model: one clear line
            ap.error(f"argument --model: cannot load {a.model!r}: {e}")
        feeds = random_inputs(model)
    else:
        model, name = light_model(a.light), f"light_{a.light} (random weights)"
        feeds = light_input(model)
    blob = model.SerializeToString()
    print(
        f"model: {name}: {len(model.graph.node)} nodes; inputs "
        + ", ".join(f"{k}{list(v.shape)}:{v.dtype}" for k, v in feeds.items())
    )

    cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    want = cpu.run(None, feeds)

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "migraphx_ep_example")
    t0 = time.perf_counter()
    try:
        sess = ort.InferenceSession(blob, so, providers=[(EP, options), "CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT's own error text names the problem
        print(f"error: {EP} could not create the session: {e}", file=sys.stderr)
        return 2
    t_create = time.perf_counter() - t0
    times = []
    for _ in range(max(a.runs, 1)):
        t0 = time.perf_counter()
        got = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    where = placement(sess)

    print(f"providers: {sess.get_providers()}")
    print("node events per provider (ORT profiler):")
    for prov, n in collections.Counter(p for p, _ in where.elements()).most_common():
        print(f"  {prov:28} {n}")
    in_model = low_types(model)
    used = set(in_model)
    used |= {TensorProto.FLOAT16} if ep_options.fp16_enable else set()
    used |= {TensorProto.BFLOAT16} if ep_options.bf16_enable else set()
    if not used:
        ok, text = judge(got, want)
    else:
        low = max(used, key=EPS.__getitem__)  # the coarsest type in play sets the tolerance
        ok, text = judge_low(got, want, float32_reference(model, feeds) if in_model else None, low)
    print(f"{text} -> {'MATCH' if ok else 'MISMATCH'}")
    print(
        f"session creation {t_create:.2f} s (compile included); "
        f"run median {sorted(times)[len(times) // 2] * 1e3:.1f} ms"
        f" over {len(times)} runs (ref target on CPU: a correctness oracle, not a speed target)"
    )
    on_ep = sum(n for (p, _), n in where.items() if p == EP)
    if on_ep == 0:
        print("ERROR: no node ran on MIGraphXExecutionProvider", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
