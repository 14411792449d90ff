"""The driver's commands: each takes the parsed arguments and returns an exit status."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from .. import mxr
from ..ir.evaluate import run_module
from ..ir.module import Module
from ..ir.operation import ModuleOp
from ..ir.program import Program
from ..migraphx import parse_onnx
from ..quantize import quantize_fp16
from ..targets import TargetError, get_target
from ..timing import CompileTimes, record, stage
from .inputs import generate_driver_inputs
from .verify import bisect, verify_program


class DriverError(Exception):
    """A problem to report in one line (bad model, bad option); the driver exits with status 1."""


def log(args: argparse.Namespace, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def _input_dims(specs: list[str]) -> dict[str, list[int]]:
    dims: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, rest = spec.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            dims[name] = [int(d) for d in rest.split(",")] if rest else []
        except ValueError:
            raise DriverError(f"--input-dim {spec!r}: expected name:d1,d2,... (e.g. x:1,3,224,224)") from None
    return dims


def _timed(args: argparse.Namespace) -> AbstractContextManager:
    """With --time, the load and the compile add to one record, printed once the program is compiled."""
    if not args.time:
        return nullcontext()
    if getattr(args, "compile_times", None) is None:
        args.compile_times = CompileTimes()
    return record(into=args.compile_times)


def load_program(args: argparse.Namespace) -> Program:
    path = args.model
    try:
        is_mxr = os.path.isfile(path) and _has_mxr_signature(path)
        with _timed(args), stage("load"):  # reading the file and ONNX shape inference; parse is its own
            if is_mxr:
                log(args, f"loading {path}")
                prog = mxr.load(path, format=None)
            else:
                log(args, f"parsing {path}")
                prog = parse_onnx(
                    path, default_dim_value=args.default_dim, map_input_dims=_input_dims(args.input_dim)
                ).ir
    except (ValueError, TypeError, OSError) as e:  # ParseError, MxrError, ShapeError are ValueErrors
        raise DriverError(str(e)) from e
    if args.fp16:
        if prog.is_compiled():
            raise DriverError("--fp16: the program is already compiled")
        with _timed(args), stage("quantize"):
            quantize_fp16(prog)
    return prog


def _has_mxr_signature(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(len(mxr.MAGIC))
    return head == mxr.MAGIC or head.lstrip()[:1] == b"{"


def pick_target(args: argparse.Namespace):
    name = "ref" if args.ref else "gpu" if args.gpu else None
    try:
        if name is not None:
            return get_target(name)
        try:
            return get_target("gpu")
        except TargetError as e:
            log(args, f"note: using the ref target ({e})")
            return get_target("ref")
    except TargetError as e:
        raise DriverError(str(e)) from e


def compile_program(args: argparse.Namespace, prog: Program) -> Program:
    if prog.is_compiled():
        wanted = "ref" if args.ref else "gpu" if args.gpu else prog.target_name
        if prog.target_name != wanted:
            raise DriverError(f"the program is compiled for {prog.target_name!r}, not {wanted!r}")
        log(args, f"already compiled for {prog.target_name}")
        return prog
    t = pick_target(args)
    log(args, f"compiling for {t.name}")
    t0 = time.perf_counter()
    with _timed(args):
        prog.compile(t, fast_math=not args.disable_fast_math, exhaustive_tune=args.exhaustive_tune)
    log(args, f"compiled in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    return prog


def print_times(args: argparse.Namespace, prog: Program) -> None:
    """With --time, the table of where the load and compile went (for a loaded .mxr: the load alone)."""
    if args.time:
        print(
            f"compile time ({prog.target_name} target), by stage:\n{args.compile_times.table()}", flush=True
        )


def _inputs(args: argparse.Namespace, prog: Program) -> dict[str, np.ndarray]:
    # From the program as parsed (before target lowering): index inputs stay inside what they index.
    return generate_driver_inputs(prog, seed=args.seed)


def _save(args: argparse.Namespace, prog: Program) -> None:
    if args.output:
        mxr.save(prog, args.output, format=args.format)
        log(args, f"saved {args.output}")


# -- commands -----------------------------------------------------------------------------------------
def cmd_read(args: argparse.Namespace) -> int:
    prog = load_program(args)
    print(prog)
    _save(args, prog)
    return 0


def cmd_params(args: argparse.Namespace) -> int:
    prog = load_program(args)
    for name, s in prog.get_parameter_shapes().items():
        print(f"{name}: {s}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    prog = compile_program(args, load_program(args))
    print(prog)
    print_times(args, prog)  # after the program, which can be thousands of lines
    _save(args, prog)
    return 0


def summarize(n: int, x: np.ndarray) -> str:
    x = np.asarray(x)
    head = f"output {n}: {x.dtype} {list(x.shape)}"
    if x.size == 0:
        return head + " (empty)"
    if x.dtype.kind in "biu":
        stats = f"min {x.min()} max {x.max()}"
    else:
        f = x.astype(np.float64)
        fin = f[np.isfinite(f)]
        stats = (
            f"min {fin.min():.6g} max {fin.max():.6g} mean {fin.mean():.6g}"
            if fin.size
            else "no finite values"
        )
        stats += f" nan {int(np.isnan(f).sum())} inf {int(np.isinf(f).sum())}"
    first = ", ".join(str(v) for v in x.ravel()[:8].tolist())
    return f"{head}: {stats}\n  [{first}{', ...' if x.size > 8 else ''}]"


def cmd_run(args: argparse.Namespace) -> int:
    prog = load_program(args)
    inputs = _inputs(args, prog)
    print_times(args, compile_program(args, prog))
    outs = prog.run_numpy(inputs)
    for n, x in enumerate(outs):
        print(summarize(n, x))
    return 0


def time_instructions(m: Module, params: dict[str, np.ndarray]) -> dict[int, float]:
    """Seconds per instruction position for one interpretation of ``m`` (the ref executor's loop)."""
    values: dict[int, np.ndarray] = {}
    times: dict[int, float] = {}
    for n, ins in enumerate(m.instructions):
        if ins.is_param():
            values[id(ins)] = params[ins.op.parameter]  # type: ignore[attr-defined]
            continue
        if ins.is_return():
            continue
        args = [values[id(a)] for a in ins.inputs]
        t0 = time.perf_counter()
        if isinstance(ins.op, ModuleOp):
            values[id(ins)] = ins.op.compute_with_modules(ins.shape, args, ins.module_args, run_module)
        else:
            values[id(ins)] = ins.op.compute(ins.shape, args)
        times[n] = time.perf_counter() - t0
    return times


def cmd_perf(args: argparse.Namespace) -> int:
    prog = load_program(args)
    inputs = _inputs(args, prog)
    prog = compile_program(args, prog)
    print_times(args, prog)
    n = max(1, args.iterations)
    # Warm-up: first-run allocations, caches and the gpu target's CUDA graph (captured at a program's
    # second Run, targets/gpu/context.py) stay out of the numbers.
    for _ in range(2):
        prog.run_numpy(inputs)
    t0 = time.perf_counter()
    for i in range(n):
        prog.run_numpy(inputs)
        if (i + 1) % max(1, n // 10) == 0:
            log(args, f"perf: iteration {i + 1}/{n}")
    total = time.perf_counter() - t0
    main = prog.get_main_module()
    acc: dict[int, float] = defaultdict(float)
    for _ in range(n):
        for pos, dt in time_instructions(main, inputs).items():
            acc[pos] += dt
    lines = main.to_text().splitlines()[1:]
    summed = sum(acc.values()) or 1.0
    print(f"Total time: {total * 1e3:.3f} ms for {n} iterations, {total * 1e3 / n:.4f} ms per run")
    print(f"{'ms/run':>10} {'%':>6}  instruction")
    rows = sorted(acc.items(), key=lambda kv: -kv[1])
    for pos, t in rows[: args.top or len(rows)]:
        print(f"{t * 1e3 / n:10.4f} {100 * t / summed:6.2f}  {lines[pos]}")
    by_op: dict[str, float] = defaultdict(float)
    for pos, t in acc.items():
        by_op[main.instructions[pos].name] += t
    print(f"\n{'ms/run':>10} {'%':>6}  operator")
    for name, t in sorted(by_op.items(), key=lambda kv: -kv[1]):
        print(f"{t * 1e3 / n:10.4f} {100 * t / summed:6.2f}  {name}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    # With --fp16 both sides run the quantised program (as MIGraphX's driver does): verify judges the
    # target, not the precision loss.
    prog = load_program(args)
    if prog.is_compiled():
        compile_program(args, prog)  # checks --ref/--gpu against the program's own target
        args.ref, args.gpu = prog.target_name == "ref", prog.target_name == "gpu"
    t = pick_target(args)
    inputs = _inputs(args, prog)
    problems = verify_program(prog, t, inputs, args.rtol, args.atol, log=lambda s: log(args, s))
    if not problems:
        print(f"verify: {t.name} matches ref (rtol {args.rtol}, atol {args.atol})")
        return 0
    print(f"verify: {t.name} DIFFERS from ref:")
    for p in problems:
        print(f"  {p}")
    if args.bisect:
        found = bisect(prog, t, inputs, args.rtol, args.atol, log=lambda s: log(args, s))
        print(
            found if found else "bisect: no single instruction differs (outputs differ only in combination)"
        )
    return 1


COMMANDS = {
    "read": cmd_read,
    "params": cmd_params,
    "compile": cmd_compile,
    "run": cmd_run,
    "perf": cmd_perf,
    "verify": cmd_verify,
}
