"""``verify``: a program compiled for a target against the ref interpretation of the same program.

``bisect`` finds the first instruction whose value differs: first in one run where every intermediate is
an output; if the target's optimisations hide the fault there (a fusion that only breaks when the values
in between are not needed), by binary search over programs cut after each instruction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..ir.dtypes import DType
from ..ir.evaluate import run_module
from ..ir.instruction import Instruction
from ..ir.program import Program

Log = Callable[[str], None]


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str | None:
    """None when ``got`` matches ``want`` (NaN where NaN, equal infinities, |g-w| <= atol + rtol*|w|)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype:
        return f"element type {got.dtype} != {want.dtype}"
    if got.shape != want.shape:
        return f"dims {list(got.shape)} != {list(want.shape)}"
    if got.size == 0:
        return None
    if (
        want.dtype.kind not in "fc"
        and want.dtype.name not in ("bfloat16",)
        and "float8" not in want.dtype.name
    ):
        bad = int(np.count_nonzero(got != want))
        return f"{bad} of {want.size} values differ" if bad else None
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    if (nan_g != nan_w).any():
        return f"NaN at {int(np.count_nonzero(nan_g != nan_w))} positions where the other side has none"
    fin = np.isfinite(w) & np.isfinite(g)
    inf_bad = (~fin & ~nan_w) & (g != w)
    with np.errstate(all="ignore"):
        err = np.where(fin, np.abs(g - w), 0.0)
        bad = (err > atol + rtol * np.abs(np.where(fin, w, 0.0))) | inf_bad
    if not bad.any():
        return None
    i = int(np.argmax(np.where(bad, err, -1.0)))
    return (
        f"{int(np.count_nonzero(bad))} of {w.size} values differ; max abs error {float(err.max()):.6g} "
        f"(got {g.ravel()[i]:.6g}, want {w.ravel()[i]:.6g} at flat index {i})"
    )


def run_target(prog: Program, target, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Compile a copy of ``prog`` (unless already compiled) and run it."""
    if prog.is_compiled():
        return prog.run_numpy(inputs)
    p = prog.clone()
    p.compile(target)
    return p.run_numpy(inputs)


def verify_program(
    prog: Program, target, inputs: dict[str, np.ndarray], rtol: float, atol: float, log: Log = lambda s: None
) -> list[str]:
    """Problems (one per differing output); empty when the target agrees with ref."""
    log("verify: running ref (uncompiled interpretation)")
    want = run_module(prog.get_main_module(), inputs)
    log(f"verify: compiling and running for target {getattr(target, 'name', target)}")
    got = run_target(prog, target, inputs)
    if len(got) != len(want):
        return [f"target returned {len(got)} outputs, ref {len(want)}"]
    problems = []
    for n, (g, w) in enumerate(zip(got, want, strict=True)):
        why = compare(g, w, rtol, atol)
        if why:
            problems.append(f"output {n}: {why}")
    return problems


@dataclass
class BisectResult:
    index: int  # position in the main module
    text: str  # the instruction as printed
    problem: str
    method: str  # "intermediates" or "prefix"

    def __str__(self) -> str:
        return f"first differing instruction ({self.method}): {self.text}\n  {self.problem}"


def _values(ins: Instruction) -> bool:
    return not (ins.is_param() or ins.is_literal() or ins.is_return() or ins.shape.type == DType.tuple_type)


def _with_outputs(prog: Program, positions: list[int]) -> Program:
    p = prog.clone()
    m = p.get_main_module()
    m.add_return([m.instructions[i] for i in positions])
    return p


def bisect(
    prog: Program, target, inputs: dict[str, np.ndarray], rtol: float, atol: float, log: Log = lambda s: None
) -> BisectResult | None:
    """The first main-module instruction whose target value differs from ref, or None if none does."""
    if prog.is_compiled():
        raise ValueError("bisect needs an uncompiled program (an .onnx model or an uncompiled .mxr)")
    main = prog.get_main_module()
    lines = main.to_text().splitlines()[1:]
    candidates = [i for i, ins in enumerate(main.instructions) if _values(ins)]
    if not candidates:
        return None
    probe = _with_outputs(prog, candidates)
    want = run_module(probe.get_main_module(), inputs)
    log(f"bisect: running {len(candidates)} intermediates on the target")
    got = run_target(probe, target, inputs)
    for pos, g, w in zip(candidates, got, want, strict=True):
        why = compare(g, w, rtol, atol)
        if why:
            return BisectResult(pos, lines[pos], why, "intermediates")
    ref_at = dict(zip(candidates, want, strict=True))
    memo: dict[int, str | None] = {}

    def fails(k: int) -> str | None:
        if k not in memo:
            log(f"bisect: program cut after {lines[candidates[k]]}")
            cut = run_target(_with_outputs(prog, [candidates[k]]), target, inputs)[0]
            memo[k] = compare(cut, ref_at[candidates[k]], rtol, atol)
        return memo[k]

    outs = [
        candidates.index(i)
        for i, ins in enumerate(main.instructions)
        if ins in main.outputs() and i in ref_at
    ]
    hi = next((k for k in sorted(outs) if fails(k)), None)
    if hi is None:
        return None
    lo = 0  # invariant: fails(hi); every cut before lo passed
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    why = fails(hi) or ""
    return BisectResult(candidates[hi], lines[candidates[hi]], why, "prefix")


__all__ = ["BisectResult", "bisect", "compare", "run_target", "verify_program"]
