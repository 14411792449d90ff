"""Fitting the numbers of several optimised programs as functions of their input dims (shape templates,
``ep/shape_template.py``): sizes as exact polynomials, strides as products of sizes, and constants
that vary as index ranges or bands (causal masks)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ..ir.operation import Literal
from ..ir.shape import standard_strides

Dims = dict[str, int]


class NotInstantiable(ValueError):
    """The template cannot give a program for these dims (a size it does not reach); compile instead."""


class NoTemplate(ValueError):
    """The programs of a group differ in a way no template describes."""


class TooFewPrograms(NoTemplate):
    """The sizes seen so far do not over-determine a fit yet (more programs may)."""


# -- numbers as polynomials in the varying dims --------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Poly:
    """sum(numerator * prod(dims)) / denominator over ``terms`` (integer arithmetic: it runs per op)."""

    terms: tuple[tuple[tuple[str, ...], int], ...]  # (dims multiplied, numerator)
    denominator: int = 1

    @staticmethod
    def of(terms: Sequence[tuple[tuple[str, ...], Fraction]]) -> Poly:
        den = math.lcm(*(c.denominator for _, c in terms)) if terms else 1
        return Poly(tuple((m, int(c * den)) for m, c in terms if c != 0), den)

    def exact(self, dims: Dims) -> Fraction:
        return Fraction(sum(n * product(m, dims) for m, n in self.terms), self.denominator)

    def at(self, dims: Dims) -> int:
        total = sum(n * product(m, dims) for m, n in self.terms)
        v, rest = divmod(total, self.denominator)
        if rest:
            raise NotInstantiable(f"a size is {Fraction(total, self.denominator)} at {dims}, not whole")
        return v


def product(monomial: tuple[str, ...], dims: Dims) -> int:
    out = 1
    for d in monomial:
        out *= dims[d]
    return out


class Fitter:
    """Exact fits of numbers seen at the group's programs (``dims``) over the monomials of ``vary``."""

    def __init__(self, dims: Sequence[Dims], vary: Sequence[str]) -> None:
        self.dims = list(dims)
        self.monomials = [m for r in range(len(vary) + 1) for m in itertools.combinations(sorted(vary), r)]
        self._solvers: dict[tuple[int, ...], np.ndarray | None] = {}
        # The same few sizes recur all over a program (every layer's sequence length): fit each once.
        self._fits: dict[tuple[int | None, ...], Poly | int | None] = {}

    def _solver(self, rows: tuple[int, ...]) -> np.ndarray | None:
        """The pseudo-inverse over programs ``rows``; None unless they over-determine the fit."""
        if rows not in self._solvers:
            a = np.array([[product(m, self.dims[r]) for m in self.monomials] for r in rows], np.float64)
            ok = len(rows) > len(self.monomials) and np.linalg.matrix_rank(a) == len(self.monomials)
            self._solvers[rows] = np.linalg.pinv(a) if ok else None
        return self._solvers[rows]

    def fit(self, values: Sequence[int | None]) -> Poly | int | None:
        """``values[i]`` at program i (None: not determined there); an int when it never varies; None
        when no program determines it (a constant's step along an axis of length 1 everywhere)."""
        key = tuple(values)
        if key not in self._fits:
            self._fits[key] = self._fit(key)
        return self._fits[key]

    def _fit(self, values: tuple[int | None, ...]) -> Poly | int | None:
        rows = tuple(i for i, v in enumerate(values) if v is not None)
        if not rows:
            return None
        seen = {values[i] for i in rows}
        if len(seen) == 1:
            return seen.pop()  # type: ignore[return-value]
        solver = self._solver(rows)
        if solver is None:
            raise TooFewPrograms("too few programs to fit a size")
        raw = solver @ np.array([values[i] for i in rows], dtype=np.float64)
        coeffs = [Fraction(float(c)).limit_denominator(1024) for c in raw]
        poly = Poly.of(list(zip(self.monomials, coeffs, strict=True)))
        if any(poly.exact(self.dims[i]) != values[i] for i in rows):
            raise NoTemplate(f"sizes {[values[i] for i in rows]} are no polynomial of {self.monomials[1:]}")
        return poly


# -- attribute trees -----------------------------------------------------------------------------------
def evaluate(node: Any, dims: Dims) -> Any:
    if isinstance(node, Poly):
        v = node.at(dims)
        if v < 0:
            raise NotInstantiable(f"a size is {v} at {dims}")
        return v
    if isinstance(node, Strides):
        lens = [evaluate(x, dims) for x in node.lens]
        if node.products is None:
            return list(standard_strides(lens))
        return [c * product(axes, lens) for axes, c in node.products]  # type: ignore[arg-type]
    if isinstance(node, list):
        return [evaluate(x, dims) for x in node]
    if isinstance(node, dict):
        return {k: evaluate(x, dims) for k, x in node.items()}
    return node


@dataclasses.dataclass(frozen=True)
class Strides:
    """A shape's strides from its fitted ``lens``: the packed ones, or per axis ``c * prod(lens[J])``
    (a transposed or sliced view of a packed value: attention's (b, h, s, s) scores have s*s)."""

    lens: list
    products: tuple[tuple[tuple[int, ...], int], ...] | None = None


def stride_products(shapes: list[dict]) -> tuple[tuple[tuple[int, ...], int], ...] | None:
    """Per axis, the fewest other axes J and the constant c with stride = c * prod(lens[J]) at every
    program; None if some axis has none."""
    rank = len(shapes[0]["lens"])
    out = []
    for k in range(rank):
        for size in range(rank + 1):
            found = None
            for axes in itertools.combinations(range(rank), size):
                cs = set()
                for sh in shapes:
                    p = product(axes, sh["lens"])  # type: ignore[arg-type]
                    if p == 0 or sh["strides"][k] % p:
                        cs = {None, -1}
                        break
                    cs.add(sh["strides"][k] // p)
                if len(cs) == 1:
                    found = (axes, cs.pop())
                    break
            if found is not None:
                out.append(found)
                break
        else:
            return None
    return tuple(out)  # type: ignore[arg-type]


def fit_tree(values: list[Any], fitter: Fitter) -> Any:
    first = values[0]
    if all(v == first and type(v) is type(first) for v in values[1:]):
        return first
    if all(type(v) is int for v in values):
        return fitter.fit(values)
    if all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
        return [fit_tree([v[i] for v in values], fitter) for i in range(len(first))]
    if all(isinstance(v, dict) for v in values) and len({tuple(v) for v in values}) == 1:
        shape = set(first) >= {"lens", "strides"}
        out = {k: fit_tree([v[k] for v in values], fitter) for k in first if not (shape and k == "strides")}
        if shape:
            strides = [v["strides"] for v in values]
            if all(x == strides[0] for x in strides):
                out["strides"] = strides[0]
            elif all(list(standard_strides(v["lens"])) == v["strides"] for v in values):
                out["strides"] = Strides(out["lens"])
            elif (products := stride_products(values)) is not None:
                out["strides"] = Strides(out["lens"], products)
            else:
                out["strides"] = fit_tree(strides, fitter)
        return out
    raise NoTemplate(f"an attribute varies in kind or length: {str(first)[:80]} vs {str(values[-1])[:80]}")


def is_constant(node: Any) -> bool:
    if isinstance(node, Poly | Strides):
        return False
    if isinstance(node, list):
        return all(is_constant(x) for x in node)
    if isinstance(node, dict):
        return all(is_constant(x) for x in node.values())
    return True


# -- constants that vary -------------------------------------------------------------------------------
def affine(v: np.ndarray) -> tuple[int | float, list[int | None]] | None:
    """``v`` as start + sum(step[k] * index[k]) (steps None along axes of length 1)."""
    flat = v.reshape(-1)
    if flat.size == 0:
        return None
    if v.dtype.kind not in "iub":  # floats: one value everywhere, or nothing
        return (flat[0].item(), [0 if n > 1 else None for n in v.shape]) if (flat == flat[0]).all() else None
    w = v.astype(np.int64)
    start = int(w.reshape(-1)[0])
    steps: list[int | None] = []
    total = np.full(w.shape, start, dtype=np.int64)
    for k, n in enumerate(w.shape):
        if n == 1:
            steps.append(None)
            continue
        idx = [0] * w.ndim
        idx[k] = 1
        step = int(w[tuple(idx)]) - start
        steps.append(step)
        shape = [1] * w.ndim
        shape[k] = n
        total = total + step * np.arange(n, dtype=np.int64).reshape(shape)
    return (start, steps) if np.array_equal(total, w) else None


def band(v: np.ndarray) -> tuple[int, Any, Any] | None:
    """``v`` as where(col - row <= k, low, high) over its last two axes, the same for every leading
    index (a causal mask, as bools or as 0 / -inf): (k, low, high)."""
    if v.ndim < 2 or v.size == 0:
        return None
    rows, cols = v.shape[-2:]
    planes = v.reshape(-1, rows, cols)
    m = planes[0]
    if not (planes == m).all():
        return None
    d = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    kinds = list(dict.fromkeys(m.reshape(-1).tolist()))
    if len(kinds) > 2:
        return None
    for low, high in ((kinds[0], kinds[-1]), (kinds[-1], kinds[0])):
        k = int(d[m == low].max()) if (m == low).any() else int(d.min()) - 1
        if np.array_equal(m, np.where(d <= k, low, high).astype(v.dtype)):
            return k, low, high
    return None


@dataclasses.dataclass(frozen=True)
class Band:
    """A constant rebuilt per shape as ``band`` describes it."""

    dtype: np.dtype
    lens: list
    k: Any
    low: Any
    high: Any

    def make(self, dims: Dims) -> Literal:
        lens = [evaluate(n, dims) for n in self.lens]
        k = self.k.at(dims) if isinstance(self.k, Poly) else self.k
        d = np.arange(lens[-1])[None, :] - np.arange(lens[-2])[:, None]
        plane = np.where(d <= k, self.low, self.high).astype(self.dtype)
        return Literal(np.ascontiguousarray(np.broadcast_to(plane, lens)))


@dataclasses.dataclass(frozen=True)
class Generated:
    """A constant rebuilt per shape: dtype, fitted lens, start and per-axis steps."""

    dtype: np.dtype
    lens: list
    start: Any
    steps: list

    def make(self, dims: Dims) -> Literal:
        lens = [evaluate(n, dims) for n in self.lens]
        start = evaluate(self.start, dims)
        out = np.full(lens, start, dtype=np.int64 if self.dtype.kind in "iub" else self.dtype)
        for k, step in enumerate(self.steps):
            s = evaluate(step, dims)
            if s is None and lens[k] > 1:
                raise NotInstantiable(f"a constant's step along axis {k} was never seen (length 1)")
            if s and lens[k] > 1:
                shape = [1] * len(lens)
                shape[k] = lens[k]
                out = out + s * np.arange(lens[k], dtype=np.int64).reshape(shape)
        return Literal(out.astype(self.dtype, copy=False))


def fit_literal(ops: list[Literal], fitter: Fitter) -> Literal | Generated | Band:
    if all(o is ops[0] for o in ops[1:]):
        return ops[0]
    values = [o.value for o in ops]
    if len({v.dtype for v in values}) != 1 or len({v.ndim for v in values}) != 1:
        raise NoTemplate("a constant varies in type or rank")
    if all(v.shape == values[0].shape for v in values) and all(o == ops[0] for o in ops[1:]):
        return ops[0]
    lens = [fitter.fit([v.shape[k] for v in values]) for k in range(values[0].ndim)]
    forms = [affine(v) for v in values]
    if any(f is None for f in forms):
        bands = [band(v) for v in values]
        if any(b is None for b in bands) or len({(b[1], b[2]) for b in bands}) != 1:  # type: ignore[index]
            raise NoTemplate(f"a constant {values[0].dtype}{list(values[0].shape)} varies in no known way")
        k = fitter.fit([b[0] for b in bands])  # type: ignore[index]
        return Band(values[0].dtype, lens, k, bands[0][1], bands[0][2])  # type: ignore[index]
    if values[0].dtype.kind not in "iub":
        if len({f[0] for f in forms}) != 1:  # type: ignore[index]
            raise NoTemplate("a float constant's value varies")
        start: Any = forms[0][0]  # type: ignore[index]
    else:
        start = fitter.fit([f[0] for f in forms])  # type: ignore[index]
    steps = [fitter.fit([f[1][k] for f in forms]) for k in range(values[0].ndim)]  # type: ignore[index]
    return Generated(values[0].dtype, lens, start, steps)
