"""Program <-> plain data (dicts, lists, bytes) for ``.mxr`` files; the file layout is in ``__init__``.

Instructions keep their order; ops are stored as name + ``attributes()`` and rebuilt with ``make_op``;
literals refer to a weight by index; every stored shape is checked against the recomputed one on load.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import numpy as np

from ..ir.dtypes import DType, from_numpy, to_numpy
from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.operation import OPS, Literal, ModuleOp, Op, make_op, op_shape_memo
from ..ir.program import Program
from ..ir.shape import Shape
from ..timing import stage

PathLike = str | os.PathLike


class MxrError(ValueError):
    """A program file that cannot be read (corrupt, truncated, foreign, other version) or written."""

    def __init__(self, path: PathLike, problem: str) -> None:
        super().__init__(f"{os.fspath(path)}: {problem}")


# -- values: shapes and arrays inside op attributes -------------------------------------------------
def _encode_value(v: Any, binary: bool) -> Any:
    if isinstance(v, Shape):
        return {"__shape__": v.to_dict()}
    if isinstance(v, np.ndarray):
        data = np.ascontiguousarray(v).tobytes()
        return {
            "__array__": {
                "type": int(from_numpy(v.dtype)),
                "dims": list(v.shape),
                "data": data if binary else base64.b64encode(data).decode("ascii"),
            }
        }
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, list | tuple):
        return [_encode_value(x, binary) for x in v]
    if isinstance(v, dict):
        return {str(k): _encode_value(x, binary) for k, x in v.items()}
    return v


def _decode_value(v: Any) -> Any:
    if isinstance(v, list):
        return [_decode_value(x) for x in v]
    if isinstance(v, dict):
        if len(v) == 1 and "__shape__" in v:
            return Shape.from_dict(v["__shape__"])
        if len(v) == 1 and "__array__" in v:
            a = v["__array__"]
            data = a["data"] if isinstance(a["data"], bytes) else base64.b64decode(a["data"], validate=True)
            return np.frombuffer(data, dtype=to_numpy(DType(a["type"]))).reshape(a["dims"]).copy()
        return {k: _decode_value(x) for k, x in v.items()}
    return v


def _op_attributes(op: Op) -> dict[str, Any]:
    """``attributes()`` with Shape-valued fields kept as shapes (``_thaw`` turns them into plain dicts)."""
    attrs = dict(op.attributes())
    for k in attrs:
        raw = getattr(op, k, None)
        if isinstance(raw, Shape | np.ndarray):
            attrs[k] = raw
    return attrs


def _same_op(a: Op, b: Op) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except (ValueError, TypeError):  # array-valued fields: compare their encodings instead
        return type(a) is type(b) and _encode_value(_op_attributes(a), True) == _encode_value(
            _op_attributes(b), True
        )


# -- program <-> plain data ----------------------------------------------------------------------------
def encode_program(prog: Program, path: PathLike, binary: bool) -> tuple[dict, list[np.ndarray]]:
    weights: list[np.ndarray] = []
    modules = []
    for m in prog.modules.values():
        m.validate()
        pos = {id(ins): n for n, ins in enumerate(m.instructions)}
        items = []
        for ins in m.instructions:
            d: dict[str, Any] = {
                "op": ins.op.name,
                "inputs": [pos[id(a)] for a in ins.inputs],
                "shape": ins.shape.to_dict(),
            }
            if ins.module_args:
                d["mods"] = [x.name for x in ins.module_args]
            if ins.is_literal():
                d["w"] = len(weights)
                weights.append(ins.op.value)  # type: ignore[attr-defined]
            else:
                attrs = _encode_value(_op_attributes(ins.op), binary)
                # A file must load back into the very same op: check the round trip now, not at load.
                try:
                    rebuilt = make_op(ins.op.name, **_decode_value(attrs))
                except Exception as e:  # noqa: BLE001 - any failure means the op cannot be saved
                    raise MxrError(path, f"op {ins.op} cannot be rebuilt from its attributes: {e}") from e
                if not _same_op(rebuilt, ins.op):
                    raise MxrError(path, f"op {ins.op} does not round-trip through attributes() ({rebuilt})")
                if attrs:
                    d["attrs"] = attrs
            items.append(d)
        modules.append({"name": m.name, "instructions": items})
    return {"modules": modules}, weights


def _module_order(specs: list[dict], path: PathLike) -> list[dict]:
    """Submodules before the modules whose instructions use them (their shapes come from them)."""
    by_name = {s["name"]: s for s in specs}
    order: list[dict] = []
    state: dict[str, int] = {}
    for root in specs:
        stack = [(root["name"], False)]
        while stack:
            name, ready = stack.pop()
            if ready:
                state[name] = 2
                order.append(by_name[name])
                continue
            if state.get(name) == 2:
                continue
            if state.get(name) == 1:
                raise MxrError(
                    path, f"corrupt program: module {name!r} refers to itself through its submodules"
                )
            state[name] = 1
            stack.append((name, True))
            for ins in by_name[name]["instructions"]:
                for sub in ins.get("mods", ()):
                    if sub not in by_name:
                        raise MxrError(path, f"corrupt program: module {name!r} uses unknown module {sub!r}")
                    if state.get(sub) != 2:
                        stack.append((sub, False))
    return order


def _fill_module(
    prog: Program, m: Module, spec: dict, weights: list[np.ndarray], path: PathLike, made: dict | None = None
) -> None:
    """``made``: the ops (by name and attributes) and stored shapes already decoded, shared by every
    module of one program (a transformer's layers and fused bodies repeat their records; ops and shapes
    are immutable, so equal records may share one)."""
    made = {} if made is None else made
    built: list[Instruction] = []
    for n, d in enumerate(spec["instructions"]):
        where = f"module {m.name!r} instruction @{n} ({d.get('op')})"
        try:
            name = d["op"]
            if any(not 0 <= i < n for i in d["inputs"]):
                raise MxrError(
                    path, f"corrupt program: {where} reads an instruction that does not precede it"
                )
            args = [built[i] for i in d["inputs"]]
            mods = [prog.modules[x] for x in d.get("mods", ())]
            if name == Literal.name:
                stored = Shape.from_dict(d["shape"])
                arr = weights[d["w"]]
                if arr.nbytes != stored.elements() * stored.type_size():
                    raise MxrError(path, f"corrupt program: {where}: weight size does not match {stored}")
                op: Op = Literal(arr.view(stored.dtype).reshape(stored.lens))
            elif name not in OPS:
                raise MxrError(path, f"{where}: unknown operator (written by a newer or extended build?)")
            else:
                key = (name, repr(d.get("attrs")))
                op = made.get(key)  # type: ignore[assignment]
                if op is None:
                    op = made[key] = make_op(name, **_decode_value(d.get("attrs", {})))
                skey = repr(d["shape"])
                stored = made.get(skey)  # type: ignore[assignment]
                if stored is None:
                    stored = made[skey] = Shape.from_dict(d["shape"])
            shape = (
                op.compute_shape_with_modules([a.shape for a in args], mods)
                if isinstance(op, ModuleOp)
                else op_shape_memo(op, [a.shape for a in args])
            )
        except MxrError:
            raise
        except Exception as e:  # noqa: BLE001 - a malformed record of any kind is a corrupt file
            raise MxrError(path, f"corrupt program: {where}: {type(e).__name__}: {e}") from e
        if shape != stored:
            raise MxrError(
                path,
                f"{where}: computes {shape} but the file says {stored} "
                "(written by a build with different op semantics?)",
            )
        built.append(m.append_computed(op, args, shape, mods))


def decode_program(
    spec: Any, weights: list[np.ndarray], target: str | None, compiled: bytes | None, path: PathLike
) -> Program:
    try:
        specs = list(spec["modules"])
        names = [s["name"] for s in specs]
        for s in specs:
            if not isinstance(s["name"], str) or not isinstance(s["instructions"], list):
                raise TypeError("bad module record")
    except (KeyError, TypeError) as e:
        raise MxrError(path, f"corrupt program section: {e}") from None
    if len(set(names)) != len(names) or "main" not in names:
        raise MxrError(path, "corrupt program section: module names are repeated or 'main' is missing")
    prog = Program()
    prog.modules = {name: Module(name) for name in names}
    with stage("mxr decode"):
        made: dict = {}
        for s in _module_order(specs, path):
            _fill_module(prog, prog.modules[s["name"]], s, weights, path, made)
    if target is not None:
        # Program has no public setter for a restored executable; this module is its serialiser.
        prog._exe = _restore_executable(prog, target, compiled, path)
        prog.target_name = target
    return prog


def _restore_executable(prog: Program, target: str, blob: bytes | None, path: PathLike) -> Any:
    from ..targets import TargetError, get_target

    try:
        t = get_target(target)
    except TargetError as e:
        raise MxrError(
            path, f"the program was compiled for target {target!r}, unavailable here: {e}"
        ) from None
    loader = getattr(t, "load_executable", None)
    if loader is not None:
        return loader(prog, blob)
    if target == "ref":
        from ..targets.ref import RefExecutable

        # The stored IR is already the post-pass program; ref has no use for a compiled blob.
        return RefExecutable(prog)
    raise MxrError(path, f"target {target!r} cannot restore a compiled program")
