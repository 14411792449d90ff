"""New input shapes on one session: what a never-seen shape costs, and what it compiles. Usage:

    python3 bench/shapes.py MODEL.onnx --dim batch=1:64 [--dim H=224:1024:32 ...] [--calls 200]
        [--systems migraphx_ep,ort_cuda,torch_dynamic] [--torch-model NAME] [--fp16] [--out shapes.jsonl]

Each ``--dim NAME=LO:HI[:STEP]`` draws the model's symbolic dim ``NAME`` (for inputs whose dim is that
``dim_param``; several names may share a draw with ``NAME1,NAME2=...``) per call, from one seeded
sequence shared by every system. Per system it reports: the first call (session + first compile), the
latency of calls whose shape was never seen (p50 / p95 / max), of calls whose shape was seen, the
NVRTC compiles and program compiles after the first call (ours), and the total time of the sequence.
``--model-cache DIR`` gives our sessions a model cache: a second run with the same folder and seed loads
the first call's program from it and meets the other shapes as a process that loaded it does.
``--extra`` also reports what being new cost each never-seen shape: its call minus a third call with
the same feeds right after (the issue's "extra" cost; the plain p50/p95 include the model's own time),
and what the second call cost beyond the third (ours captures the shape's CUDA graph there).
``torch_dynamic`` is ``torch.compile(module, dynamic=True)`` on the same call sequence, for a model of
``bench/torch_models.py`` named by ``--torch-model`` (its inputs arrive from the host and its outputs go
back there, as ORT's numpy I/O does). ``--steady`` then compares, for a few of the shapes, a Run in this
session with a Run in a session whose first (fully specialised, timed-search) compile was that shape.

Ours also reports the compiles that ran on the background thread (``background_compiles``: batch sizes
served by a larger batch's program meanwhile, ep/batch_serve.py), how many gave way to a compile on a
Run's critical path and started over (``background_preempted``), how long they went on after the last
call (``background_drain_s``), and NVRTC compiles after the first call inside the calls
(``nvrtc_compiles_after_first``, which also counts a background compile's that overlaps a call) and in
all (``nvrtc_compiles_after_first_all``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import onnx
from jsonl import emit  # bench/ is the script's folder: on sys.path

from migraphx_ep.timing import CompileTimes, record

EP = "MIGraphXExecutionProvider"


def _ranges(specs: list[str]) -> list[tuple[list[str], list[int]]]:
    out = []
    for spec in specs:
        names, _, rng = spec.partition("=")
        parts = [int(p) for p in rng.split(":")]
        lo, hi, step = parts[0], parts[1], parts[2] if len(parts) > 2 else 1
        out.append((names.split(","), list(range(lo, hi + 1, step))))
    return out


def _feeds(model: onnx.ModelProto, dims: dict[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    from migraphx_ep.testing import random_feeds

    return random_feeds(model, lambda _, name: dims[name], rng)


def _sequence(ranges, calls: int, seed: int) -> list[dict[str, int]]:
    rng = np.random.default_rng(seed)
    seq = []
    for _ in range(calls):
        d = {}
        for names, values in ranges:
            v = int(rng.choice(values))
            d.update({n: v for n in names})
        seq.append(d)
    return seq


class TorchDynamic:
    """``torch.compile(dynamic=True)`` of a bench model behind ORT's ``run(None, feeds)``."""

    def __init__(self, name: str, path: str) -> None:
        import specs
        import torch
        import torch_models

        if name not in torch_models.BUILDERS:
            known = ", ".join(sorted(torch_models.BUILDERS))
            raise SystemExit(f"--torch-model {name!r}: not a bench model ({known})")
        self.torch, self.names = torch, [i.name for i in specs.MODELS[name].inputs]
        module = torch_models.build(name, specs.file_dtype(path), "cuda")
        self.compiled = torch.compile(module, dynamic=True)

    def run(self, _outputs: None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        t = self.torch
        with t.no_grad():
            outs = self.compiled(*(t.from_numpy(feeds[n]).to("cuda") for n in self.names))
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        return [o.cpu().numpy() for o in outs]


def _session(system: str, path: str, fp16: bool, torch_model: str = ""):
    import onnxruntime as ort

    if system == "torch_dynamic":
        if not torch_model:
            raise SystemExit("torch_dynamic needs --torch-model (a name in bench/torch_models.py)")
        return TorchDynamic(torch_model, path)

    if system == "migraphx_ep":
        import migraphx_ep

        opts = {"migraphx_target": "gpu", "migraphx_fp16_enable": "1" if fp16 else "0"}
        ours = (migraphx_ep.get_ep_name(), opts)
        return ort.InferenceSession(path, providers=[ours, "CPUExecutionProvider"])
    return ort.InferenceSession(path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])


def _pct(xs: list[float], q: float) -> float | None:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def run_system(
    system: str, path: str, model, seq, fp16: bool, seed: int, torch_model: str = "", gap: tuple = (0, 0.0),
    extra: bool = False,
) -> dict:  # fmt: skip
    """``gap``: (every, seconds) idle after every ``every``-th call (a workload whose new shapes come
    now and then, so background compiles run between them); the idle time is not in ``sequence_s``.
    ``extra``: each never-seen shape's call is followed by two more with the same feeds; the third's
    time is subtracted (``new_shape_extra_ms_*``: what being new cost beyond running the model at that
    shape; ``second_call_extra_ms_*``: what the second call cost beyond it) and both are kept out of
    ``sequence_s``."""
    counters = background = None
    if system == "migraphx_ep":
        from migraphx_ep.ep.background import BACKGROUND
        from migraphx_ep.targets.gpu import nvrtc

        counters, background = nvrtc.compile_count, BACKGROUND
    t0 = time.perf_counter()
    sess = _session(system, path, fp16, torch_model)
    rng = np.random.default_rng(seed)
    seen: set[tuple] = set()
    new_ms, old_ms, extra_ms, second_ms, first_s = [], [], [], [], 0.0
    calls: list[dict] = []  # each never-seen shape's call: what the tail of the distribution is made of
    nvrtc_after_first = 0
    stages = CompileTimes()  # where the compiles after the first call spent their time (ours)
    start = time.perf_counter()
    done0 = background.done if background else 0
    preempted0 = getattr(background, "preempted", 0)
    nvrtc_first = 0
    idle = 0.0
    gc_clock = _GcClock()  # the cyclic collector's pauses, which no compile stage shows
    slowest: tuple[float, CompileTimes | None, float] = (0.0, None, 0.0)  # ms, its stages, its GC ms
    for i, dims in enumerate(seq):
        if gap[0] and i and i % gap[0] == 0:
            time.sleep(gap[1])
            idle += gap[1]
        feeds = _feeds(model, dims, rng)
        key = tuple(sorted(dims.items()))
        c0 = counters() if counters else 0
        new = bool(i) and key not in seen
        call_stages, gc0 = CompileTimes(), gc_clock.seconds
        t = time.perf_counter()
        with record(call_stages) if new else nullcontext():
            sess.run(None, feeds)
        ms = (time.perf_counter() - t) * 1e3
        if new and extra:
            # The same feeds twice more: the second call captures our CUDA graph (targets/gpu/context.py
            # capture_run), the third is the shape's steady time, subtracted from both.
            again = []
            for _ in range(2):
                t = time.perf_counter()
                sess.run(None, feeds)
                again.append(time.perf_counter() - t)
            extra_ms.append(ms - again[1] * 1e3)
            second_ms.append((again[0] - again[1]) * 1e3)
            idle += sum(again)
        if new:
            calls.append({
                "dims": dims, "ms": round(ms, 2), **({"extra_ms": round(extra_ms[-1], 2)} if extra else {}),
                "stage_ms": {n: round(1e3 * x, 2) for n, x, _ in call_stages.rows() if x >= 5e-4},
            })  # fmt: skip
            stages.merge(call_stages)
            stages.total += call_stages.total
            if ms > slowest[0]:
                slowest = (ms, call_stages, (gc_clock.seconds - gc0) * 1e3)
        if i == 0:
            first_s = time.perf_counter() - t0
            nvrtc_first = counters() if counters else 0
        else:
            (old_ms if key in seen else new_ms).append(ms)
            nvrtc_after_first += (counters() - c0) if counters else 0
        seen.add(key)
    total_s = time.perf_counter() - start - idle
    rec = {
        "system": system, "calls": len(seq), "shapes": len(seen), "first_call_s": first_s,
        "new_shape_ms_p50": _pct(new_ms, 0.5), "new_shape_ms_p95": _pct(new_ms, 0.95),
        "new_shape_ms_max": max(new_ms) if new_ms else None, "seen_shape_ms_p50": _pct(old_ms, 0.5),
        "sequence_s": total_s, "gc_s": round(gc_clock.seconds, 3),
        **({"new_shape_extra_ms_p50": _pct(extra_ms, 0.5), "new_shape_extra_ms_p95": _pct(extra_ms, 0.95),
            "new_shape_extra_ms_max": max(extra_ms), "second_call_extra_ms_p50": _pct(second_ms, 0.5),
            "second_call_extra_ms_p95": _pct(second_ms, 0.95)} if extra_ms else {}),
        "gc_max_ms": round(gc_clock.longest * 1e3, 1),
    }  # fmt: skip
    gc_clock.close()
    if slowest[1] is not None:  # where the slowest never-seen call's time went
        rec["slowest_new_shape"] = {
            "ms": round(slowest[0], 1), "gc_ms": round(slowest[2], 1),
            "stage_ms": {n: round(1e3 * x, 1) for n, x, _ in slowest[1].rows() if x},
        }  # fmt: skip
    rec["new_shape_calls"] = calls
    if background is not None:
        # Batch sizes served by a larger batch's program compile their own on a background thread
        # (ep/batch_serve.py): how many, and how long they kept going after the last call.
        t = time.perf_counter()
        background.wait()
        rec["background_drain_s"] = time.perf_counter() - t
        rec["background_compiles"] = background.done - done0
        # Background compiles that gave way to a new shape's compile and started over (ep/background.py)
        rec["background_preempted"] = getattr(background, "preempted", 0) - preempted0
    if counters:
        # NVRTC inside the calls (the critical path), and in all after the first call (background too)
        rec["nvrtc_compiles_after_first"] = nvrtc_after_first
        rec["nvrtc_compiles_after_first_all"] = counters() - nvrtc_first
        # Never-seen shapes instantiated from a shape template (ep/shape_template.py): no parse, no passes
        from migraphx_ep.ep.shape_template import STATS

        rec["template_instantiated"] = STATS["instantiated"]
        rec["template_instantiated_background"] = STATS["background"]
        rec["templates_fitted_dropped"] = [STATS["fitted"], STATS["dropped"]]
        # Per never-seen shape: the seconds of each compile stage (parse, passes, nvrtc, library...).
        per = max(1, len(new_ms))
        rec["new_shape_stage_ms"] = {n: round(1e3 * s / per, 2) for n, s, _ in stages.rows() if s}
    rec["_session"] = sess
    return rec


class _GcClock:
    """Seconds the cyclic garbage collector ran (all generations), and its longest single pause."""

    def __init__(self) -> None:
        self.seconds = self.longest = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            dt = time.perf_counter() - self._t0
            self.seconds += dt
            self.longest = max(self.longest, dt)

    def close(self) -> None:
        gc.callbacks.remove(self._on)


def _restore(saved: dict[str, str | None]) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _wait_background() -> None:
    """Until the background compiles are done: the quiet second they wait for (no compile on a Run's
    critical path, in any session: the comparison sessions just compiled), then the queue."""
    from migraphx_ep.ep import background_compiles
    from migraphx_ep.ep.background import BACKGROUND

    BACKGROUND.wait_quiet(background_compiles.QUIET_S)
    BACKGROUND.wait()


def steady(path: str, model, sess, shapes: list[dict[str, int]], fp16: bool, runs: int = 20) -> list[dict]:
    """Per shape: median Run in the dynamic session vs in a session whose first compile was that shape,
    with every size baked into its kernels (MIGRAPHX_EP_RUNTIME_SIZES=0): the fully specialised program;
    ``fresh_ms``: a new session with the dynamic session's settings whose first compile was that shape.
    Batch rows are off in both (MIGRAPHX_EP_BATCH_ROWS=0): each runs a program of this very shape."""
    out = []
    for dims in shapes:
        feeds = _feeds(model, dims, np.random.default_rng(0))
        saved = {k: os.environ.get(k) for k in ("MIGRAPHX_EP_RUNTIME_SIZES", "MIGRAPHX_EP_BATCH_ROWS")}
        # Both comparison sessions compile this very shape: no batch served by a larger program.
        os.environ["MIGRAPHX_EP_BATCH_ROWS"] = "0"
        try:
            os.environ["MIGRAPHX_EP_RUNTIME_SIZES"] = "0"
            fixed = _session("migraphx_ep", path, fp16)
            fixed.run(None, feeds)  # compiles here, with every size baked in
            _restore({"MIGRAPHX_EP_RUNTIME_SIZES": saved["MIGRAPHX_EP_RUNTIME_SIZES"]})
            fresh = _session("migraphx_ep", path, fp16)  # `sess`'s kernels, this shape compiled first
            fresh.run(None, feeds)
        finally:
            _restore(saved)
        times = {}
        for name, s in (("dynamic_ms", sess), ("specialised_ms", fixed), ("fresh_ms", fresh)):
            # A size served padded gets its own program, a quick one its timed one, once no compile
            # is on the critical path: run, let them happen, run again -- steady state.
            for _ in range(2):
                _wait_background()
                s.run(None, feeds)
            ts = []
            for _ in range(runs):
                t = time.perf_counter()
                s.run(None, feeds)
                ts.append((time.perf_counter() - t) * 1e3)
            times[name] = statistics.median(ts)
        out.append({"dims": dims, **times, "ratio": times["dynamic_ms"] / times["specialised_ms"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--dim", action="append", default=[], help="NAME[,NAME2]=LO:HI[:STEP]")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--systems", default="migraphx_ep")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--torch-model", default="", help="torch_dynamic's model: resnet50, bert_base or gpt2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steady", type=int, default=3, help="shapes to compare with a specialised compile")
    ap.add_argument("--out", default="")
    ap.add_argument("--baked-sizes", action="store_true", help="MIGRAPHX_EP_RUNTIME_SIZES=0 (the sequence)")
    ap.add_argument("--gap-every", type=int, default=0, help="idle after every N calls (with --gap-s)")
    ap.add_argument("--gap-s", type=float, default=0.0, help="seconds of idle (not counted in the total)")
    ap.add_argument("--extra", action="store_true", help="also time each new shape again: its extra cost")
    ap.add_argument(
        "--model-cache", default="", help="ORT_MIGRAPHX_MODEL_CACHE_PATH for our sessions (run twice: load)"
    )
    a = ap.parse_args()
    if a.gap_every < 0 or a.gap_s < 0 or bool(a.gap_every) != bool(a.gap_s):
        ap.error("--gap-every and --gap-s go together, and neither may be negative")
    if a.baked_sizes:
        os.environ["MIGRAPHX_EP_RUNTIME_SIZES"] = "0"
    if a.model_cache:  # a second run with the same folder loads the first call's program from it
        os.environ["ORT_MIGRAPHX_MODEL_CACHE_PATH"] = a.model_cache
    model = onnx.load(a.model, load_external_data=False)
    seq = _sequence(_ranges(a.dim), a.calls, a.seed)
    for system in a.systems.split(","):
        gap = (a.gap_every, a.gap_s)
        rec = run_system(system, a.model, model, seq, a.fp16, a.seed, a.torch_model, gap, a.extra)
        sess = rec.pop("_session")
        rec["model"] = Path(a.model).name
        if a.gap_every:
            rec["gap"] = {"every": a.gap_every, "s": a.gap_s}
        if system == "migraphx_ep" and a.steady:
            picks = [seq[i] for i in range(1, len(seq), max(1, len(seq) // a.steady))][: a.steady]
            rec["steady"] = steady(a.model, model, sess, picks, a.fp16)
        emit(rec, a.out)


if __name__ == "__main__":
    main()
