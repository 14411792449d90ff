"""Shape templates: a never-seen input shape takes the optimised program of others, re-sized.

Parsing a model and running the target's passes cost most of a new shape's compile (BERT-base: 110 of
190 ms), yet the programs they give for two sequence lengths differ only in numbers: the sizes in
attributes (``reshape`` dims, ``multibroadcast`` out_lens, ``slice`` ends, parameter shapes) and a few
small constants (index ranges, masks of ones). A *template* is the optimised program with each such
number written as a function of the input dims that vary, so a new shape is a substitution: no parse and
no passes, only lowering and what follows it.

``Templates`` collects the optimised programs compiled for real shapes. Programs with the same structure
(ops, wiring, submodules) form a group; a template is fitted to a group once it holds more programs than
the fit has unknowns, so every fit is checked on at least one program it was not needed for:
  * a number that varies is a polynomial with rational coefficients, linear in each varying dim
    (``3``, ``s``, ``b*s``, ``s/2``: monomials over subsets of the dims), fitted exactly;
  * a constant that varies is either one value everywhere, (integers) an affine function of the
    element's index (``arange``, a flattened range), or a band over its last two axes (a causal
    mask): its start and steps, or its diagonal, are fitted in turn;
  * a shape's strides are the packed ones at every program, products of its sizes (``s*s`` for a
    transposed view of attention scores), or fitted like any number.
Anything else (a float that varies, a list whose length varies, a constant of another kind) means no
template for that group; shapes then compile as before. A substitution must give whole, non-negative
numbers, and each instruction's shape is computed by its op again, so a dim the fit does not reach fails
loudly (``NotInstantiable``) and compiles instead. As with ``batch_rows`` and ``runtime_dims``, agreement
at the sampled sizes stands for all sizes; the full compiles of the first ``CHECKS`` shapes the
template served (the timed recompiles in the background) are compared with it, and a disagreement
drops the template.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.operation import Literal, ModuleOp, Op, make_op, op_key, op_shape_memo
from ..ir.program import Program
from ..ir.shape import Shape
from ..mxr.codec import _decode_value, _encode_value, _module_order, _op_attributes
from ..switches import env_choice
from ..timing import stage
from .background import BACKGROUND
from .shape_fit import (
    Band,
    Dims,
    Fitter,
    Generated,
    NoTemplate,
    NotInstantiable,
    TooFewPrograms,
    evaluate,
    fit_literal,
    fit_tree,
    is_constant,
)

log = logging.getLogger("migraphx_ep")

MAX_POINTS = 12  # programs kept per group while no template fits (the newest)
# Full compiles of shapes a template served that must agree with it before the background's timed
# compiles instantiate too (until then each one parses and runs the passes, to check the template).
CHECKS = 3
# The process's counts (benchmarks read them): programs instantiated on a Run's critical path and on
# the background thread, templates fitted and dropped.
STATS = {"instantiated": 0, "background": 0, "fitted": 0, "dropped": 0}
# How ``Template.instantiate`` makes an instruction's op: the template's own, from fitted attributes
# (one op per distinct fit and program), or rebuilt (a constant that varies).
_AS_IS, _FITTED, _REBUILT = "as is", "fitted", "rebuilt"

__all__ = [
    "NoTemplate",
    "NotInstantiable",
    "Point",
    "Template",
    "TemplateCompiles",
    "Templates",
    "flatten",
    "templates_enabled",
    "variables",
]


# -- programs ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Record:
    op: Op
    inputs: tuple[int, ...]
    mods: tuple[str, ...]
    attrs: Any  # encoded attributes (None for a literal)


@dataclasses.dataclass
class Point:
    """An optimised program compiled for ``dims``, flattened for comparing."""

    dims: Dims
    weights: Any  # the program's WeightCache and the derived weights it holds: not the program (nor
    derived: list  # its executable and device memory)
    modules: dict[str, list[_Record]]
    order: list[str]  # submodules before their users

    target: str | None = None

    @property
    def structure(self) -> tuple:
        return (self.target,) + tuple(
            (name, tuple((r.op.name, r.inputs, r.mods) for r in recs)) for name, recs in self.modules.items()
        )


def flatten(dims: Dims, prog: Program) -> Point:
    modules: dict[str, list[_Record]] = {}
    for m in prog.modules.values():
        pos = {id(ins): n for n, ins in enumerate(m.instructions)}
        modules[m.name] = [
            _Record(
                ins.op,
                tuple(pos[id(a)] for a in ins.inputs),
                tuple(x.name for x in ins.module_args),
                None if ins.is_literal() else _encode_value(_op_attributes(ins.op), True),
            )
            for ins in m.instructions
        ]
    specs = [{"name": n, "instructions": [{"mods": r.mods} for r in recs]} for n, recs in modules.items()]
    order = [s["name"] for s in _module_order(specs, "template")]
    return Point(dict(dims), prog.weights, list(prog.derived_weights), modules, order, prog.target_name)


class Template:
    """The programs of one structure, each number a fit over ``vary``; the other dims are ``fixed``."""

    def __init__(self, points: Sequence[Point], vary: Sequence[str]) -> None:
        ref = points[-1]
        self.fixed = {d: v for d, v in ref.dims.items() if d not in vary}
        self.vary = tuple(sorted(vary))
        self.order = ref.order
        self.target = ref.target
        self.weights, self.derived = ref.weights, ref.derived
        self.agreed = 0  # full compiles of shapes it covers that gave its program
        fitter = Fitter([p.dims for p in points], vary)
        self.modules: dict[str, list[tuple[Any, tuple[int, ...], tuple[str, ...]]]] = {}
        # Repeated layers repeat their ops: one fitted op per distinct (name, attributes), made once
        # per instantiation (ops are immutable, so instructions share them).
        self.varying: dict[Any, int] = {}
        self._shape_keys: dict[Any, int] = {}
        for name, recs in ref.modules.items():
            out = []
            for i, r in enumerate(recs):
                same = [p.modules[name][i] for p in points]
                if isinstance(r.op, Literal):
                    what: Any = fit_literal([x.op for x in same], fitter)  # type: ignore[misc]
                else:
                    tree = fit_tree([x.attrs for x in same], fitter)
                    what = r.op if is_constant(tree) else self._intern(r.op.name, tree)
                out.append((what, r.inputs, r.mods))
            self.modules[name] = out
        # Repeated layers own equal bodies (BERT-base: 100 fused ops' bodies, 10 distinct). Bodies whose
        # records are equal fits are equal at every dims, so an instantiation builds each once and its
        # users share it: ~1,700 instructions become ~600 (lowering rebinds a body per user).
        self.same = self._same_modules()
        self._plan = {
            name: [self._step(w, i, tuple(self.same.get(x, x) for x in mods)) for w, i, mods in recs]
            for name, recs in self.modules.items()
            if name not in self.same
        }

    def _same_modules(self) -> dict[str, str]:
        """Each submodule equal to an earlier one (in build order) -> that one's name. Equal: record for
        record the same fit slot, op key, literal bytes or fitted constant, the same wiring, and
        submodules that are equal in turn."""
        first: dict[tuple, str] = {}
        same: dict[str, str] = {}
        for name in self.order:
            if name == "main":
                continue
            sig = tuple(
                (_record_key(w), i, tuple(same.get(x, x) for x in mods)) for w, i, mods in self.modules[name]
            )
            if None in (k for k, _, _ in sig):
                continue  # a record without an exact key: this body is built for itself
            same_as = first.setdefault(sig, name)
            if same_as != name:
                same[name] = same_as
        return same

    def _intern(self, name: str, tree: Any) -> tuple[str, Any, int]:
        key = (name, repr(tree))
        slot = self.varying.setdefault(key, len(self.varying))
        return (name, tree, slot)

    def _step(self, what: Any, inputs: tuple[int, ...], mods: tuple[str, ...]) -> tuple:
        """How ``instantiate`` makes one instruction: (kind, what, inputs, mods, shape key). The shape
        key names the op up to equality of its attributes' exact reprs (``op_key``): equal keys, equal
        input shapes and the same submodules give equal shapes. None where the shape is computed every
        time: literals (their shape is their own) and ops whose attributes have no exact repr."""
        if isinstance(what, Generated | Band):
            return (_REBUILT, what, inputs, mods, None)
        if isinstance(what, tuple):
            return (_FITTED, what, inputs, mods, self._shape_key(("fitted", what[2])))
        k = None if isinstance(what, Literal) else op_key(what)
        return (_AS_IS, what, inputs, mods, None if k is None else self._shape_key(k))

    def _shape_key(self, key: Any) -> int:
        return self._shape_keys.setdefault(key, len(self._shape_keys))

    def covers(self, dims: Dims) -> bool:
        same = set(dims) == set(self.fixed) | set(self.vary)
        return same and all(dims[d] == v for d, v in self.fixed.items())

    def instantiate(self, dims: Dims) -> Program:
        """The program for ``dims`` (which ``covers``); NotInstantiable where a fit does not reach."""
        prog = Program()
        prog.modules = modules = {name: Module(name) for name in self._plan}
        made: list[Op | None] = [None] * len(self.varying)
        # Repeated layers compute the same shapes (BERT-base: ~270 distinct of ~1,700): each (shape
        # key, input shapes) once per program. Per program, as fitted ops are made per program.
        known: dict[tuple, Shape] = {}
        for name in self.order:
            if name in self.same:
                continue
            m = modules[name]
            built: list[Instruction] = []
            for kind, what, inputs, mods, key in self._plan[name]:
                if kind == _AS_IS:
                    op: Op = what
                elif kind == _FITTED:
                    op = made[what[2]]  # type: ignore[assignment]
                    if op is None:
                        op = made[what[2]] = make_op(what[0], **_decode_value(evaluate(what[1], dims)))
                else:
                    op = what.make(dims)
                args = [built[i] for i in inputs]
                subs = [modules[x] for x in mods] if mods else ()
                shapes = [a.shape for a in args]
                try:
                    if key is None:
                        shape = _shape(op, shapes, subs)
                    else:  # an op owning bodies: by its bodies too (equal layers share them)
                        k = (key, *map(id, subs), *shapes) if subs else (key, *shapes)
                        shape = known.get(k)  # type: ignore[assignment]
                        if shape is None:
                            shape = known[k] = _shape(op, shapes, subs)
                except Exception as e:  # noqa: BLE001 - any op's refusal: this shape compiles instead
                    raise NotInstantiable(f"{op.name} at {dims}: {e}") from e
                built.append(m.append_computed(op, args, shape, subs))
        prog.weights = self.weights
        prog.derived_weights = list(self.derived)
        return prog

    def disagrees(self, point: Point) -> str | None:
        """Why ``point`` (a full compile of dims this template covers) is not what it would give."""
        if point.structure != (self.target,) + tuple(
            (name, tuple((_name(w), i, x) for w, i, x in recs)) for name, recs in self.modules.items()
        ):
            return "its structure differs"
        for name, recs in self.modules.items():
            for (what, _, _), r in zip(recs, point.modules[name], strict=True):
                if isinstance(what, Generated | Band):
                    if what.make(point.dims) != r.op:
                        return f"a constant differs in module {name}"
                elif isinstance(what, tuple):
                    if evaluate(what[1], point.dims) != r.attrs:
                        return f"{what[0]}'s attributes differ in module {name}"
                elif isinstance(what, Literal):
                    if what is not r.op and what != r.op:
                        return f"a constant differs in module {name}"
                elif _encode_value(_op_attributes(what), True) != r.attrs:
                    return f"{what.name}'s attributes differ in module {name}"
        return None


def _shape(op: Op, shapes: list[Shape], subs: Sequence[Module]) -> Shape:
    if isinstance(op, ModuleOp):
        return op.compute_shape_with_modules(shapes, list(subs))
    return op_shape_memo(op, shapes)


def _record_key(what: Any) -> Hashable | None:
    """What makes a template record equal to another at every dims (None: no exact key)."""
    if isinstance(what, tuple):
        return ("fitted", what[2])  # one slot per distinct (op name, fit)
    if isinstance(what, Literal):
        return ("literal", what.digest())
    if isinstance(what, Generated | Band):
        return None
    k = op_key(what)
    return None if k is None else ("op", k)


def _name(what: Any) -> str:
    if isinstance(what, Generated | Band):
        return Literal.name
    return what[0] if isinstance(what, tuple) else what.name


# -- the programs of one subgraph ----------------------------------------------------------------------
def variables(names: Sequence[str], declared: Sequence[list | None]) -> list[list[str | None]]:
    """Per input axis, the dim it is (its ONNX name, or ``input:axis`` when unnamed); None if static."""
    out = []
    for name, dims in zip(names, declared, strict=True):
        if dims is None:
            out.append(None)
            continue
        out.append(
            [
                None if isinstance(d, int) and d >= 0 else (d if isinstance(d, str) and d else f"{name}:{a}")
                for a, d in enumerate(dims)
            ]
        )
    return out  # type: ignore[return-value]


class Templates:
    """Groups the optimised programs of one subgraph by structure and fits templates to them."""

    def __init__(self, names: Sequence[str], declared: Sequence[list | None]) -> None:
        self.axes = variables(names, declared)
        self.groups: dict[tuple, list[Point]] = {}
        self.failed: set[tuple] = set()  # groups whose programs differ in a way no template describes
        self.templates: dict[tuple, Template] = {}
        self.served = 0  # programs instantiated
        self.dropped = 0  # templates a full compile disagreed with

    def dims(self, key: Sequence[Sequence[int]]) -> Dims | None:
        """The varying dims' sizes in input dims ``key``; None when a dim has two sizes (or a rank
        differs from the declared one)."""
        out: Dims = {}
        for axes, lens in zip(self.axes, key, strict=False):
            if axes is None:
                return None  # an input of unknown rank: nothing to fit over
            if len(axes) != len(lens):
                return None
            for d, n in zip(axes, lens, strict=True):
                if d is not None and out.setdefault(d, int(n)) != n:
                    return None
        return out

    def find(self, dims: Dims) -> Template | None:
        """The most specific template for ``dims`` (the most dims fixed), if any."""
        fits = [t for t in self.templates.values() if t.covers(dims)]
        return max(fits, key=lambda t: len(t.fixed), default=None)

    def add(self, dims: Dims, prog: Program, name: str) -> None:
        """Learn from ``prog``, compiled in full for ``dims``: check the template that covers them,
        and fit one to its group once the group over-determines it."""
        point = flatten(dims, prog)
        sig = point.structure
        t = self.templates.get(sig)
        if t is not None and t.covers(dims):
            why = t.disagrees(point)
            if why is None:
                t.agreed += 1
                return
            self.dropped += 1
            STATS["dropped"] += 1
            del self.templates[sig]
            self.failed.add(sig)
            log.warning("%s: shape template dropped: the full compile for %s disagrees (%s)", name, dims, why)
            return
        if sig in self.failed:
            return
        group = self.groups.setdefault(sig, [])
        if any(p.dims == dims for p in group):
            return  # compiled again (the timed program): it pins nothing down that its first did not
        group.append(point)
        del group[:-MAX_POINTS]
        vary = [d for d in dims if len({p.dims[d] for p in group}) > 1]
        if not vary or len(group) <= 1 << len(vary):
            return
        try:
            self.templates[sig] = Template(group, vary)
        except TooFewPrograms:
            return  # the sizes seen so far do not pin the fit down yet
        except NoTemplate as e:
            self.failed.add(sig)
            self.groups.pop(sig, None)
            log.info("%s: no shape template over %s: %s", name, vary, e)
            return
        fixed = self.templates[sig].fixed
        STATS["fitted"] += 1
        log.info("%s: shape template over %s from %d programs (fixed: %s)", name, vary, len(group), fixed)


def templates_enabled(target: str) -> bool:
    """Shape templates (ep/shape_template.py): on by default for the gpu target; the ref target, the
    oracle, parses every shape unless ``MIGRAPHX_EP_SHAPE_TEMPLATES=1`` asks otherwise."""
    flag = env_choice("MIGRAPHX_EP_SHAPE_TEMPLATES", "auto", ("auto", "0", "1"))
    return flag == "1" or (flag == "auto" and target == "gpu")


class TemplateCompiles:
    """``CompiledSubgraph``'s side of the templates: instantiate a never-seen shape on a Run's critical
    path, and hand every full compile's program to them."""

    name: str
    options: Any
    templates: Templates | None
    _compile_optimised: Callable[[Program, Any, str], None] | None

    def _instantiate(self, dims: Sequence[Sequence[int]]) -> Program | None:
        """The program for ``dims`` from a shape template, lowered (no parse, no passes); None when no
        template covers them, or on a background thread until ``CHECKS`` of its full compiles of served
        shapes agreed with the template (they are what checks it)."""
        if self.templates is None or self._compile_optimised is None:
            return None
        tdims = self.templates.dims(dims)
        t = self.templates.find(tdims) if tdims is not None else None
        if t is None or (BACKGROUND.on_thread() and t.agreed < CHECKS):
            return None
        with stage("template"):
            try:
                prog = t.instantiate(tdims)  # type: ignore[arg-type]
            except NotInstantiable as e:
                log.info("%s: shape template does not reach %s: %s", self.name, tdims, e)
                return None
            except Exception:  # noqa: BLE001 - a template's fault must not fail a Run: parse instead
                self._templates_failed("instantiating")
                return None
        self._compile_optimised(prog, self.options, t.target)  # type: ignore[arg-type]
        if BACKGROUND.on_thread():
            STATS["background"] += 1
        else:
            self.templates.served += 1
            STATS["instantiated"] += 1
        return prog

    def _templates_failed(self, doing: str) -> None:
        log.warning("%s: shape templates switched off after an error %s one", self.name, doing, exc_info=True)
        self.templates = None

    def _learn(self, dims: Sequence[Sequence[int]], prog: Program) -> None:
        """Give a full compile's optimised program to the shape templates (checked against the one
        that covers it, or a new point to fit)."""
        tdims = self.templates.dims(dims)  # type: ignore[union-attr]
        if tdims:
            with stage("template"):
                try:
                    self.templates.add(tdims, prog, self.name)  # type: ignore[union-attr]
                except Exception:  # noqa: BLE001 - as above: the program itself compiled fine
                    self._templates_failed("fitting")
