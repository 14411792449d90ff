"""Turn ``run.py``'s JSONL into ``docs/benchmarks.md`` (tables) and ``docs/benchmarks.json`` (rows + env).

    python3 bench/report.py results.jsonl [more.jsonl ...] [--md docs/benchmarks.md] [--json FILE]

Only formats what the JSONL holds: a number missing there is a dash here, a failed system says
``error`` and its message is listed below the tables. Where a (model, batch, dtype, system) appears more
than once (files appended by several runs), the last line wins.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import specs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OURS = "migraphx_ep"
IOB = "migraphx_ep_iobinding"
EP = "MIGraphXExecutionProvider"  # the provider name in ORT's profiler events
SYSTEMS = {  # column order and headers
    OURS: "ours (migraphx_ep)",
    IOB: "ours, IOBinding",
    "migraphx_ep_qdq": "ours on the QDQ model",
    "migraphx_ep_qdq_iobinding": "ours on the QDQ model, IOBinding",
    "ort_cuda_numpy": "ORT CUDA EP",
    "ort_cuda_iobinding": "ORT CUDA EP, IOBinding",
    "torch_eager": "torch eager",
    "torch_compile_default": "torch.compile",
    "torch_compile_reduce-overhead": "torch.compile reduce-overhead",
    "ort_cpu": "ORT CPU EP",
}
R_O = "torch_compile_reduce-overhead"
# (header, system, peer, peer's dtype: None = the row's own); int8/fp8 tables: ORT runs the QDQ model.
RATIOS = [
    ("ours / ORT CUDA", OURS, "ort_cuda_numpy", None),
    ("ours / torch.compile r-o", OURS, R_O, None),
    ("ours IOB / ORT CUDA IOB", IOB, "ort_cuda_iobinding", None),
    ("ours IOB / torch r-o", IOB, R_O, None),
]
QUANT_RATIOS = [
    ("ours / ORT CUDA QDQ", OURS, "ort_cuda_numpy", None),
    ("ours IOB / ORT CUDA QDQ IOB", IOB, "ort_cuda_iobinding", None),
    ("ours on QDQ IOB / ORT CUDA QDQ IOB", "migraphx_ep_qdq_iobinding", "ort_cuda_iobinding", None),
    ("ours / ours fp16", OURS, OURS, "fp16"),
    ("ours IOB / ours IOB fp16", IOB, IOB, "fp16"),
]
TITLES = {"resnet50": "ResNet-50", "bert_base": "BERT-base seq128", "gpt2": "GPT-2 seq128"}
ENV_KEYS = {
    "date": "date (UTC)",
    "gpu": "GPU",
    "gpu_memory": "GPU memory",
    "driver": "driver",
    "torch_cuda": "CUDA (torch build)",
    "ort": "onnxruntime",
    "ort_file": "onnxruntime loaded from",
    "torch": "torch",
    "torchvision": "torchvision",
    "transformers": "transformers",
    "onnx": "onnx",
    "migraphx_ep": "migraphx_ep",
    "git_commit": "project commit",
    "python": "python",
    "host_cpus": "host CPU cores (ORT CPU EP threads)",
    "warmup": "warm-up runs",
    "runs": "timed runs",
}


def read(paths: list[str]) -> tuple[list[dict], list[dict], list[dict]]:
    envs, results, skipped = [], [], []
    for p in paths:
        for n, line in enumerate(Path(p).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                print(f"{p}:{n}: not JSON (a run cut mid-line?), skipped", file=sys.stderr)
                continue
            if rec.get("kind") not in ("env", "skipped"):
                rec.setdefault("source", Path(p).name)  # its run: ratios within a row stay within it
            {"env": envs, "result": results, "skipped": skipped}.get(rec.get("kind"), results).append(rec)
    return envs, results, skipped


def latest(results: list[dict]) -> dict[tuple, dict]:
    return {(r["model"], r["batch"], r["dtype"], r["system"]): r for r in results}


def _model_key(model: str) -> tuple[int, str]:
    names = list(specs.MODELS)
    return (names.index(model) if model in names else len(names), model)


def _dtype_key(dtype: str) -> tuple[int, str]:
    order = specs.ALL_DTYPES
    return (order.index(dtype) if dtype in order else len(order), dtype)


def row_order(keys: set[tuple]) -> list[tuple]:
    """(model, batch) pairs: the benchmark's models in their usual order, then files by name."""
    return sorted(keys, key=lambda k: (_model_key(k[0]), k[1]))


def row_dtype_order(keys: set[tuple]) -> list[tuple]:
    """(model, batch, dtype) triples, grouped by dtype."""
    return sorted(keys, key=lambda k: (_dtype_key(k[2]), _model_key(k[0]), k[1]))


def _ms(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3f}" if x < 10 else f"{x:.2f}" if x < 100 else f"{x:.1f}"


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _e(x: float | None) -> str:
    return "—" if x is None else f"{x:.1e}"


def _rel(acc: dict) -> str:
    """max_rel, marked where run.py flagged it over the dtype's tolerance (specs.MAX_REL)."""
    return _e(acc.get("max_rel")) + (" **over**" if acc.get("ok") is False else "")


def _cell(rec: dict | None) -> str:
    if rec is None:
        return "—"
    return "error" if "error" in rec else _ms(rec.get("ms"))


def _ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or "ms" not in a or "ms" not in b or not b["ms"]:
        return "—"
    return f"{a['ms'] / b['ms']:.2f}"


def short_error(msg: str, limit: int = 300) -> str:
    """ORT wraps an EP's message in C++ frames and a Python stack: keep the exception type and the message."""
    kind, _, rest = msg.partition(": ")
    rest = rest.split("\n\nAt:")[0]
    i = rest.find("[ONNXRuntimeError]")
    text = f"{kind}: {rest[i:] if i > 0 else rest}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _title(model: str, batch: int) -> str:
    return f"{TITLES.get(model, model)} | {batch}"


def _quant_options(rec: dict) -> dict[str, str]:
    """The options an int8/fp8 row of ours ran with beyond the mode and the table (--quant-ep-option)."""
    opts = rec.get("quant", {}).get("ep_options", {})
    return {k: v for k, v in opts.items() if not k.endswith(("8_enable", "native_calibration_table"))}


def _numpy_overhead(ours: dict, iob: dict) -> str:
    """µs a numpy-I/O Run takes beyond the graph replay and the copies it cannot avoid (``copies_ms``)."""
    if "ms" not in ours or "copies_ms" not in ours or iob.get("graph_ms") is None:
        return "—"
    return f"{(ours['ms'] - iob['graph_ms'] - ours['copies_ms']) * 1e3:.0f}"


def same_run(results: list[dict]) -> dict[tuple, dict]:
    """Every result by (source file, model, batch, dtype, system): the rows of one run."""
    return {(r.get("source"), r["model"], r["batch"], r["dtype"], r["system"]): r for r in results}


def speed_tables(by: dict[tuple, dict], runs: dict[tuple, dict] | None = None) -> list[str]:
    """One table per dtype, with the systems that ran (not only ``skipped``) in it. A quant row's ratio
    to our fp16 row takes the fp16 row of its own run (``runs``, from ``same_run``) where there is one."""
    out = []
    for dtype in sorted({k[2] for k in by}, key=_dtype_key):
        quant = dtype in specs.QUANT_DTYPES
        ran = {k[3] for k, r in by.items() if k[2] == dtype and "skipped" not in r}
        present = [s for s in SYSTEMS if s in ran]
        rows = row_order({(k[0], k[1]) for k in by if k[2] == dtype})
        out += [f"### {dtype}: median ms per run (lower is better)", ""]
        if quant:
            qdq = " ORT and `ours on the QDQ model`: ORT's int8 QDQ model of it." if dtype == "int8" else ""
            opts = {
                f"`{o}={v}`" for k, r in by.items() if k[2] == dtype for o, v in _quant_options(r).items()
            }
            with_ = f"`migraphx_{dtype}_enable=1`" + "".join(f", {o}" for o in sorted(opts))
            note = f"Ours: the fp32 file with {with_} (bench/quant_rows.py).{qdq}"
            out += [note + " fp16 ratios: over our fp16 row of the same run.", ""]
        # fp8 has no QDQ peer: only the ratios to our fp16 row
        ratios = [r for r in QUANT_RATIOS if dtype == "int8" or r[3]] if quant else RATIOS
        extra = ["ours: graph replay", "ours: IOB overhead us", "ours: numpy overhead us"]
        head = ["model", "batch", *(SYSTEMS[s] for s in present), *extra, *(r[0] for r in ratios)]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for model, batch in rows:
            got = {s: by.get((model, batch, dtype, s)) for s in SYSTEMS}
            cells = [_cell(got[s]) for s in present]
            iob = got.get(IOB) or {}
            cells += [_ms(iob.get("graph_ms")), f"{iob['overhead_us']:.0f}" if "overhead_us" in iob else "—"]
            cells.append(_numpy_overhead(got.get(OURS) or {}, iob))
            for _, a, b, d in ratios:
                cells.append(_ratio(got[a], _peer(by, runs, got[a], (model, batch, d or dtype, b))))
            out.append(f"| {_title(model, batch)} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def _peer(by: dict[tuple, dict], runs: dict[tuple, dict] | None, rec: dict | None, key: tuple) -> dict | None:
    """The row ``key`` from ``rec``'s run when that run has it, else the latest one."""
    if runs is not None and rec is not None:
        mine = runs.get((rec.get("source"), *key))
        if mine is not None:
            return mine
    return by.get(key)


def quant_accuracy_table(by: dict[tuple, dict]) -> list[str]:
    """int8/fp8 rows: every system's max rel against the fp32 model; over the tolerance is marked."""
    keys = {k for k, r in by.items() if k[2] in specs.QUANT_DTYPES and "vs_fp32" in r.get("accuracy", {})}
    present = [s for s in SYSTEMS if any(k[3] == s for k in keys)]
    if not present:
        return []
    head = ["model", "batch", "dtype", *(SYSTEMS[s] for s in present), "tolerance"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, batch, dtype in row_dtype_order({k[:3] for k in keys}):
        cells = []
        for s in present:
            acc = (by.get((model, batch, dtype, s)) or {}).get("accuracy", {}).get("vs_fp32", {})
            cells.append("error" if "error" in acc else _rel(acc))
        tol = specs.MAX_REL.get(dtype)
        out.append(f"| {_title(model, batch)} | {dtype} | " + " | ".join(cells) + f" | {tol} |")
    return ["### int8 and fp8 against the fp32 model: max |q - fp32| / max |fp32|", "", *out, ""]


def compile_table(by: dict[tuple, dict]) -> list[str]:
    head = [
        "model",
        "batch",
        "dtype",
        "ours cold (s)",
        "ours from cache (s)",
        "cache files",
        "ORT CUDA session (s)",
        "ORT CUDA first run (s)",
        "torch.compile first call (s)",
        "torch.compile r-o first call (s)",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, batch, dtype in row_dtype_order({k[:3] for k in by}):
        ours = by.get((model, batch, dtype, OURS)) or {}
        cuda = by.get((model, batch, dtype, "ort_cuda_numpy")) or {}
        tcd = by.get((model, batch, dtype, "torch_compile_default")) or {}
        tco = by.get((model, batch, dtype, "torch_compile_reduce-overhead")) or {}
        cells = [
            _s(ours.get("cold", {}).get("total_s")),
            _s(ours.get("warm", {}).get("total_s")),
            str(ours["cache_files"]) if "cache_files" in ours else "—",
            _s(cuda.get("session_s")),
            _s(cuda.get("first_run_s")),
            _s(tcd.get("compile_s")),
            _s(tco.get("compile_s")),
        ]
        out.append(f"| {_title(model, batch)} | {dtype} | " + " | ".join(cells) + " |")
    return out


def launches_table(by: dict[tuple, dict]) -> list[str]:
    """Kernels per model: what our program launches per Run (the IOBinding row's ``launches``)."""
    head = ["model", "batch", "dtype", "steps", "generated kernels", "cuBLASLt GEMMs", "cuDNN convolutions",
            "CUDA graph: kernels", "CUDA graph: other nodes"]  # fmt: skip
    out = []
    for model, batch, dtype in row_dtype_order({k[:3] for k in by}):
        n = (by.get((model, batch, dtype, IOB)) or {}).get("launches")
        if not n:
            continue
        kernels = n.get("graph_kernel")
        other = sum(
            v for k, v in n.items() if k.startswith("graph_") and k not in ("graph_kernel", "graph_error")
        )
        cells = [n["steps"], n["generated"], n["gemm"], n["conv"], kernels if kernels is not None else "—",
                 other if kernels is not None else "—"]  # fmt: skip
        out.append(f"| {_title(model, batch)} | {dtype} | " + " | ".join(map(str, cells)) + " |")
    if not out:
        return []
    return [
        "## Kernels per model",
        "",
        "What our program launches per Run (IOBinding rows): its steps (one generated kernel, cuBLASLt "
        "call or cuDNN call each; views and constants cost none) and the nodes of the CUDA graph a Run "
        "replays (the libraries' own kernels included).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *out,
        "",
    ]


def accuracy_table(by: dict[tuple, dict]) -> list[str]:
    head = [
        "model",
        "batch",
        "dtype",
        "ours vs ORT CUDA: max abs",
        "max rel",
        "ours vs torch: max abs",
        "max rel",
        "non-finite",
        "nodes on CPU",
        "ORT CUDA vs torch: max abs",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, batch, dtype in row_dtype_order({k[:3] for k in by}):
        ours = by.get((model, batch, dtype, OURS)) or {}
        acc = ours.get("accuracy", {})
        cuda_acc = (by.get((model, batch, dtype, "ort_cuda_numpy")) or {}).get("accuracy", {})
        place = ours.get("placement")
        cpu = "—"
        if place is not None:
            cpu = ", ".join(f"{k} {v}" for k, v in place["fallback_ops"].items()) or "0"
            if not place["node_events"].get(EP):
                cpu = "all (no node on our EP)"
        nonfinite = sum(a.get("nonfinite", 0) for a in acc.values()) if acc else None
        cells = [
            _e(acc.get("vs_ort_cuda", {}).get("max_abs")),
            _rel(acc.get("vs_ort_cuda", {})),
            _e(acc.get("vs_torch", {}).get("max_abs")),
            _rel(acc.get("vs_torch", {})),
            "—" if nonfinite is None else str(nonfinite),
            cpu,
            _e(cuda_acc.get("vs_torch", {}).get("max_abs")),
        ]
        out.append(f"| {_title(model, batch)} | {dtype} | " + " | ".join(cells) + " |")
    return out


def commit_of_tree(tree: str) -> str | None:
    """The local commit whose tree is ``tree`` (run.py's ``git_tree``), or None."""
    try:
        log = subprocess.run(
            ["git", "-C", str(REPO), "log", "--all", "--format=%H %T", "-n", "2000"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except Exception:
        return None
    return next((c for c, t in (line.split() for line in log.splitlines()) if t == tree), None)


def commit_values(envs: list[dict], given: str | None) -> list[str]:
    """What the runs measured: the commit whose tree each run recorded; else the run's git HEAD, which
    on the GPU machine's copy is stale (``--commit`` then says which commit it was)."""
    if given:
        heads = sorted({str(e["git_commit"]) for e in envs if e.get("git_commit")})
        return [f"{given} (given to report.py; the runs' stale git HEAD: {', '.join(heads) or '—'})"]
    values = []
    for e in envs:
        found = commit_of_tree(e["git_tree"]) if e.get("git_tree") else None
        if found:
            values.append(found)
        elif e.get("git_commit"):
            dirty = " (with uncommitted changes)" if e.get("git_dirty") else ""
            values.append(str(e["git_commit"]) + dirty)
    return list(dict.fromkeys(values))


def env_lines(envs: list[dict], commit: str | None = None) -> list[str]:
    out = ["| | |", "|---|---|"]
    for key, label in ENV_KEYS.items():
        values = list(dict.fromkeys(str(e[key]) for e in envs if e.get(key) not in (None, "")))
        if key == "git_commit":
            values = commit_values(envs, commit)
        if values:
            out.append(f"| {label} | {', '.join(values)} |")
    return out


def errors_table(results: list[dict]) -> list[str]:
    errs = [r for r in latest(results).values() if "error" in r]
    if not errs:
        return []
    out = ["## Failures", "", "| model | batch | dtype | system | error |", "|---|---|---|---|---|"]
    for r in errs:
        msg = short_error(r["error"]).replace("|", "\\|")
        out.append(f"| {r['model']} | {r['batch']} | {r['dtype']} | {r['system']} | {msg} |")
    return out + [""]


def skipped_lines(by: dict[tuple, dict]) -> list[str]:
    """Systems a dtype does not run (``skipped`` lines), one sentence per reason."""
    reasons: dict[str, set[str]] = {}
    for (_, _, dtype, system), r in by.items():
        if "skipped" in r:
            reasons.setdefault(r["skipped"], set()).add(f"{system} ({dtype})")
    return [f"Not run: {', '.join(sorted(v))}: {k}." for k, v in reasons.items()] + ([""] if reasons else [])


def markdown(
    envs: list[dict], results: list[dict], skipped: list[dict], sources: list[str], commit: str | None = None
) -> str:
    by = latest(results)
    timed = {k: r for k, r in by.items() if k[3] != "*"}
    gpu = ", ".join(dict.fromkeys(e.get("gpu", "unknown GPU") for e in envs)) or "unknown GPU"
    dates = sorted({e["date"][:10] for e in envs if "date" in e})
    out = [
        f"# Benchmarks: {gpu}, {', '.join(dates) or 'undated'}",
        "",
        f"Generated by `bench/report.py` from {', '.join(f'`{Path(s).name}`' for s in sources)}; do not edit "
        "by hand. What each number includes: `bench/README.md`. All systems ran in one process per run on "
        "one GPU with the same seeded inputs; models have random weights.",
        "",
        *env_lines(envs, commit),
        "",
        "## Inference time",
        "",
        "Ours, ORT CUDA EP and ORT CPU EP: `sess.run` with numpy inputs and outputs (host<->device copies "
        "included). IOBinding: inputs and outputs stay on the GPU. torch: inputs on the GPU, "
        "`torch.cuda.synchronize()` after each call. Ratios: our median over the peer's median "
        "(below 1: ours is faster); the ORT ratio is like for like (both numpy in/out), as is the IOB one "
        "(both IOBinding, device in/out). Graph replay: our program's CUDA graph alone; IOB overhead: "
        "ours with IOBinding minus that replay (ORT, the shell's native Run path, the copies into the "
        "program's arena), from short blocks of Runs and replays that alternate (results before "
        "2026-11-24's fifth session: from the two medians, timed apart); numpy overhead: ours with numpy "
        "I/O minus the replay and minus the host<->device "
        "copies of the same bytes from pageable memory, timed alone (``copies_ms``).",
        "",
    ]
    out += speed_tables(timed, same_run(results)) if timed else ["No results.", ""]
    out += [
        "## Compile and session time",
        "",
        "Ours cold: session creation + first run (the program for this batch is compiled there) with an "
        "empty `migraphx_model_cache_dir`; from cache: the same on a second session over that directory. "
        "torch.compile: the first call (Dynamo + Inductor; CUDA graphs are recorded in the warm-up calls "
        "after it).",
        "",
        *compile_table(timed),
        "",
        *launches_table(timed),
        "## Accuracy",
        "",
        "Largest difference over all outputs, at the row's inputs: max |ours - ref| and that divided by "
        "max |ref|. Non-finite: values finite in the reference but not in ours. Nodes on CPU: op types ORT's "
        "profiler saw on another provider during our EP's first run (0: the whole graph ran on our EP).",
        "",
        *accuracy_table(timed),
        "",
        *quant_accuracy_table(timed),
    ]
    out += errors_table(results) + skipped_lines(timed)
    for s in skipped:
        rows = ", ".join(f"{r['model']} bs{r['batch']} {r['dtype']}" for r in s["rows"])
        out += [f"Not started ({s['reason']}): {rows}.", ""]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl", nargs="+")
    ap.add_argument("--md", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--json", default=str(REPO / "docs" / "benchmarks.json"))
    ap.add_argument("--commit", help="the commit measured, for runs recorded before run.py kept git_tree")
    a = ap.parse_args()
    envs, results, skipped = read(a.jsonl)
    Path(a.md).write_text(markdown(envs, results, skipped, a.jsonl, a.commit))
    doc = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sources": [Path(s).name for s in a.jsonl],
        "env": envs,
        "rows": results,
        "skipped": skipped,
    }
    Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(results)} rows, {len(envs)} env lines -> {a.md}, {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
