"""Helpers for pass tests: run a pass twice (idempotence), compare structure and numbers bit for bit."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.instruction import Instruction
from migraphx_ep.ir.module import Module
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.passes.manager import Pass, run_passes


def run_twice(p: Pass | list[Pass], m: Module) -> None:
    """Run the pass(es) (validated after each, we're under pytest); a second run must change nothing."""
    passes = p if isinstance(p, list) else [p]
    run_passes(m, passes)
    before = m.structure()
    for q in passes:
        assert not q.apply(m), f"{q.name} is not idempotent:\n{m}"
    assert m.structure() == before


def random_inputs(m: Module, seed: int = 0, specials: bool = True) -> dict[str, np.ndarray]:
    """Random values per parameter; floats also get NaN, +-inf and -0.0 so inexact rewrites show."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, s in m.get_parameter_shapes().items():
        dt = s.dtype
        if dt == np.bool_:
            v = rng.integers(0, 2, s.lens).astype(bool)
        elif dt.kind in "iu":
            info = np.iinfo(dt)
            v = rng.integers(max(info.min, -1000), min(info.max, 1000), s.lens, endpoint=True).astype(dt)
            if v.size >= 4:
                v.flat[:2] = [info.min, info.max]
        else:
            v = rng.standard_normal(s.lens).astype(np.float32).astype(dt)
            if specials and v.size >= 8:
                v.flat[:4] = np.array([np.nan, np.inf, -np.inf, -0.0], np.float32).astype(dt)
        out[name] = np.asarray(v)
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical, except that any NaN equals any NaN (IEEE leaves NaN sign and payload open)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "iub":
        return a.tobytes() == b.tobytes()
    na, nb = np.isnan(a.astype(np.float64)), np.isnan(b.astype(np.float64))
    return bool(np.array_equal(na, nb)) and a[~na].tobytes() == b[~nb].tobytes()


def check_pass(
    p: Pass | list[Pass],
    build: Callable[[], Module],
    expected: Callable[[], Module] | None = None,
    seeds: tuple[int, ...] = (0, 1),
) -> Module:
    """Build, run twice, compare with ``expected()`` structurally and with the original bit for bit."""
    m = build()
    run_twice(p, m)
    if expected is not None:
        want = expected()
        assert m == want, f"got:\n{m}\nexpected:\n{want}"
    ref = build()
    for seed in seeds:
        feeds = random_inputs(ref, seed)
        for got, exp in zip(run_module(m, feeds), run_module(ref, feeds), strict=True):
            assert same_bits(got, exp), f"numbers changed (seed {seed}):\n{got}\nvs\n{exp}"
    return m


class Build:
    """Terse module building for tests: ``b = Build(); x = b.param("x", [2, 3]); y = b("neg", x)``."""

    def __init__(self) -> None:
        self.m = Module()

    def param(self, name: str, lens: list[int], dtype: type = np.float32) -> Instruction:
        return self.m.add_parameter(name, Shape(from_numpy(np.dtype(dtype)), lens))

    def lit(self, value: object, dtype: type = np.float32) -> Instruction:
        return self.m.add_literal(np.asarray(value, dtype=dtype))

    def __call__(self, name: str, *args: Instruction, **attrs: object) -> Instruction:
        return self.m.add_instruction(make_op(name, **attrs), list(args))

    def ret(self, *outs: Instruction) -> Module:
        self.m.add_return(list(outs))
        return self.m
