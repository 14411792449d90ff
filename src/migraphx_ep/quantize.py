"""Quantisation transforms on a whole program: fp16, int8 (calibrated), fp8 parameter autocast.

Each edits the program in place, like MIGraphX's ``quantize_fp16``/``quantize_int8``/``autocast_fp8``,
and must run before ``compile``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .ir.dtypes import DType, to_numpy
from .ir.instruction import Instruction
from .ir.module import Module
from .ir.operation import OPS, Literal, ModuleOp, Param, make_op, op_shape_memo
from .ir.program import Program
from .ir.shape import Shape
from .ir.weights import WeightCache, op_key
from .passes.dead_code_elimination import dead_code_elimination

WIDE_FLOATS = frozenset({DType.float_type, DType.double_type})
FP8_TYPES = frozenset(
    {DType.fp8e4m3fnuz_type, DType.fp8e4m3fn_type, DType.fp8e5m2_type, DType.fp8e5m2fnuz_type}
)
QUANT_INPUT_TYPES = frozenset({DType.float_type, DType.half_type, DType.double_type, DType.bf16_type})
# Ops whose meaning involves element types or submodule signatures: quantising them would change it.
_FP16_NEVER = frozenset({"@param", "@literal", "@return", "convert", "get_tuple_elem"})
# fp8 products accumulate in float32 (ops/quant.py): sums of up to 448 * 448 per term, far past fp16's
# 65504. What reads such an accumulator (its dequantising scale) stays in float32; its scaled result is
# then in the tensor's own range and converts to half safely.
_ACCUMULATORS = frozenset({"quant_dot", "quant_convolution"})
# id(x) -> (x, x in half): holding x keeps its id from being reused by a new instruction.
Cache = dict[int, tuple[Instruction, Instruction]]


class QuantizeError(ValueError):
    """The program cannot be quantised as asked (compiled already, missing ops, bad calibration)."""


def _require_uncompiled(prog: Program, what: str) -> None:
    if prog.is_compiled():
        raise QuantizeError(f"{what}: the program is already compiled; quantise before compile()")


def _convert(m: Module, before: Instruction, x: Instruction, t: DType) -> Instruction:
    return m.insert_instruction(before, make_op("convert", target_type=t), [x])


# -- fp16 ----------------------------------------------------------------------------------------------
def _as_half(
    m: Module,
    user: Instruction,
    x: Instruction,
    cache: Cache,
    t: DType = DType.half_type,
    weights: WeightCache | None = None,
) -> Instruction:
    """``x`` in the narrow float ``t``, reusing an existing narrow value where the round trip is exact."""
    if id(x) in cache:
        return cache[id(x)][1]
    src = x.inputs[0] if x.name == "convert" and x.inputs else None
    if src is not None and src.shape.type == t:
        h = src  # convert(half -> float) -> convert(float -> half) is the identity
    elif x.is_literal():
        # A weight converted once per subgraph (ir/weights.py), not once per input shape, by the
        # convert op's own meaning (what folding a convert of it would compute, under the same key).
        lit: Literal = x.op  # type: ignore[assignment]
        conv, out = make_op("convert", target_type=t), x.shape.with_type(t)
        half = functools.partial(conv.compute, out, [lit.value])
        h = m.add_literal(weights.derive(op_key(conv, out), [lit], half) if weights else half())
    elif x.name in ("multibroadcast", "broadcast"):
        # Convert what is broadcast, then broadcast it (the same numbers, fewer converted): converting
        # a broadcast weight would fold to a copy of it per batch index (a convolution's bias: per
        # pixel too), made (and uploaded, and read by its kernel) again for every batch size.
        h = m.insert_instruction(user, x.op, [_as_half(m, user, x.inputs[0], cache, t, weights)])
    else:
        h = _convert(m, user, x, t)
    cache[id(x)] = (x, h)
    return h


def _quantize_fp16_module(
    m: Module, names: set[str] | None, t: DType = DType.half_type, weights: WeightCache | None = None
) -> bool:
    cache: Cache = {}
    changed = False
    for ins in m:
        if ins.name in _FP16_NEVER or isinstance(ins.op, ModuleOp) or ins.module_args:
            continue
        if names is not None and ins.name not in names:
            continue
        if ins.shape.type == DType.tuple_type or not any(a.shape.type in WIDE_FLOATS for a in ins.inputs):
            continue
        if any(a.name in _ACCUMULATORS and a.shape.type in WIDE_FLOATS for a in ins.inputs):
            continue
        new_shapes = [a.shape.with_type(t) if a.shape.type in WIDE_FLOATS else a.shape for a in ins.inputs]
        try:
            # Through the op's memo: the half instruction inserted below asks again on these shapes.
            out = op_shape_memo(ins.op, new_shapes)
        except (ValueError, TypeError):
            continue  # this op has no half version: leave it in full precision
        back_shape = out if out.type == ins.shape.type else out.with_lens(out.lens, ins.shape.type)
        if back_shape != ins.shape:
            # Views (transpose, slice...) would come back standard and leave their users' shapes stale;
            # they cost nothing in float anyway.
            continue
        args = [
            _as_half(m, ins, a, cache, t, weights) if a.shape.type in WIDE_FLOATS else a for a in ins.inputs
        ]
        new = m.insert_instruction(ins, ins.op, args)
        back = new if new.shape.type == ins.shape.type else _convert(m, ins, new, ins.shape.type)
        if back is not new:
            cache[id(back)] = (back, new)  # the next quantised user reads ``new`` directly
        m.replace_all_uses(ins, back)
        m.remove_instruction(ins)
        changed = True
    if changed:
        dead_code_elimination(m)
    return changed


def quantize_fp16(prog: Program, ins_names: Sequence[str] = ("all",)) -> None:
    """Run float/double instructions (``ins_names``, or all) in half precision; inputs and outputs keep
    their types (converts are inserted at the boundaries, and back-to-back converts cancel)."""
    _require_uncompiled(prog, "quantize_fp16")
    names = None if "all" in ins_names else set(ins_names)
    for m in prog.modules.values():
        _quantize_fp16_module(m, names, DType.half_type, prog.weights)


def quantize_bf16(prog: Program, ins_names: Sequence[str] = ("all",)) -> None:
    """As :func:`quantize_fp16`, in bfloat16 (the EP's ``migraphx_bf16_enable``)."""
    _require_uncompiled(prog, "quantize_bf16")
    names = None if "all" in ins_names else set(ins_names)
    for m in prog.modules.values():
        _quantize_fp16_module(m, names, DType.bf16_type, prog.weights)


# -- int8 ----------------------------------------------------------------------------------------------
def _sites(m: Module, names: set[str]) -> list[Instruction]:
    """Distinct float inputs of the instructions to quantise, in program order."""
    seen: dict[int, Instruction] = {}
    for ins in m.instructions:
        if ins.name in names:
            for a in ins.inputs:
                if a.shape.type in QUANT_INPUT_TYPES and not a.shape.dynamic():
                    seen.setdefault(id(a), a)
    return list(seen.values())


def _abs_max(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    finite = x[np.isfinite(x)]
    return float(np.max(np.abs(finite))) if finite.size else 0.0


def calibrate(
    prog: Program, sites: Sequence[Instruction], t: Any = None, calibration: Iterable[Mapping[str, Any]] = ()
) -> list[float]:
    """Per-site abs-max over the calibration inputs: a copy of the program also returns every site,
    is compiled for ``t`` (interpreted when None) and run on each input set."""
    from .migraphx import generate_inputs

    main = prog.get_main_module()
    index = {id(ins): n for n, ins in enumerate(main.instructions)}
    cal = prog.clone()
    cm = cal.get_main_module()
    outs = cm.outputs()
    cm.add_return(outs + [cm.instructions[index[id(s)]] for s in sites])
    if t is not None:
        cal.compile(t)
    data = list(calibration)
    if not data:
        # MIGraphX calibrates on generated data when none is given; so do we, deterministically.
        data = [generate_inputs(prog.get_parameter_shapes(), seed=0)]
    maxes = [0.0] * len(sites)
    for params in data:
        res = cal.run_numpy({k: np.asarray(v) for k, v in params.items()})
        for i, r in enumerate(res[len(outs) :]):
            maxes[i] = max(maxes[i], _abs_max(r))
    return maxes


# Largest magnitude of each quantised type: a tensor's abs-max maps onto it (symmetric, zero point 0).
QMAX = {DType.int8_type: 127.0, DType.fp8e4m3fn_type: 448.0, DType.fp8e4m3fnuz_type: 240.0}
QUANT_OPS = ("dot", "convolution")
SiteRanges = Callable[[list[Instruction]], list[float]]


def _fake_quant(m: Module, before: Instruction, x: Instruction, scale: float, qtype: DType) -> Instruction:
    """dequantizelinear(quantizelinear(x)) with a per-tensor symmetric scale into ``qtype``. A broadcast
    ``x`` (a MatMul weight broadcast over the batch) is quantised before it is broadcast: folded, the
    quantised weight stays one copy, not one per batch index that every GEMM would then read."""
    s = m.add_literal(np.asarray(scale, dtype=x.shape.dtype))
    z = m.add_literal(np.zeros((), dtype=to_numpy(qtype)))

    def spread(v: Instruction, lens: tuple[int, ...]) -> Instruction:
        return m.insert_instruction(before, make_op("multibroadcast", out_lens=lens), [v]) if lens else v

    base = x.inputs[0] if x.name == "multibroadcast" else x
    q = m.insert_instruction(
        before, make_op("quantizelinear"), [base, spread(s, base.shape.lens), spread(z, base.shape.lens)]
    )
    if base is not x:
        q = m.insert_instruction(before, x.op, [q])
    return m.insert_instruction(
        before, make_op("dequantizelinear"), [q, spread(s, x.shape.lens), spread(z, x.shape.lens)]
    )


def quantize_static(
    prog: Program, qtype: DType, ranges: SiteRanges, ins_names: Sequence[str] = QUANT_OPS
) -> int:
    """Quantise the float inputs of ``ins_names`` instructions to ``qtype`` (int8 or fp8 E4M3) with one
    symmetric scale per tensor, ``abs-max / QMAX``; ``ranges`` gives the abs-max of each site (from
    calibration runs or a calibration table). Inserts quantizelinear/dequantizelinear pairs, which
    :mod:`passes.simplify_qdq` turns into ``quant_dot``/``quant_convolution``. Returns the site count."""
    _require_uncompiled(prog, f"quantize to {qtype.name}")
    if qtype not in QMAX:
        raise QuantizeError(f"cannot quantise to {qtype.name}; valid: {', '.join(t.name for t in QMAX)}")
    missing = [n for n in ("quantizelinear", "dequantizelinear") if n not in OPS]
    if missing:
        raise QuantizeError(f"quantisation needs the {' and '.join(missing)} op(s), not in this build")
    main = prog.get_main_module()
    sites = _sites(main, set(ins_names))
    if not sites:
        return 0
    maxes = ranges(sites)
    for site, mx in zip(sites, maxes, strict=True):
        if not np.isfinite(mx) or mx < 0:
            raise QuantizeError(f"range {mx} of a {site.name} result is not a finite abs-max")
        scale = mx / QMAX[qtype] if mx > 0 else 1.0  # all-zero: any scale represents it exactly
        users = [u for u in dict.fromkeys(site.outputs) if u.name in ins_names]
        first = min(users, key=main.instructions.index)
        fq = _fake_quant(main, first, site, scale, qtype)
        for u in users:
            main.replace_instruction(u, u.op, [fq if a is site else a for a in u.inputs])
    return len(sites)


def quantize_int8(
    prog: Program,
    t: Any = None,
    calibration: Iterable[Mapping[str, Any]] = (),
    ins_names: Sequence[str] = QUANT_OPS,
) -> None:
    """Quantise the float inputs of ``ins_names`` instructions to int8 with scales from calibration."""
    _require_uncompiled(prog, "quantize_int8")
    quantize_static(prog, DType.int8_type, lambda sites: calibrate(prog, sites, t, calibration), ins_names)


def quantize_fp8(
    prog: Program,
    t: Any = None,
    calibration: Iterable[Mapping[str, Any]] = (),
    ins_names: Sequence[str] = QUANT_OPS,
) -> None:
    """As :func:`quantize_int8`, into fp8 E4M3 (OCP ``fp8e4m3fn``, largest value 448)."""
    _require_uncompiled(prog, "quantize_fp8")
    fp8 = DType.fp8e4m3fn_type
    quantize_static(prog, fp8, lambda sites: calibrate(prog, sites, t, calibration), ins_names)


# -- fp8 autocast --------------------------------------------------------------------------------------
def autocast_fp8(prog: Program) -> None:
    """fp8 parameters become float parameters converted to fp8 inside; fp8 outputs are returned as float."""
    _require_uncompiled(prog, "autocast_fp8")
    m = prog.get_main_module()
    for p in m.get_parameters():
        if p.shape.type not in FP8_TYPES:
            continue
        name: str = p.op.parameter  # type: ignore[attr-defined]
        fshape = Shape(DType.float_type, p.shape.lens)
        # Add under a temporary name, take the old one's place, then take its name.
        tmp = m.add_parameter(f"{name}#autocast_fp8", fshape)
        m.move_instruction(tmp, p)
        body = next(i for i in m.instructions if not i.is_param())
        cvt = _convert(m, body, tmp, p.shape.type)
        m.replace_all_uses(p, cvt)
        m.remove_instruction(p)
        m.replace_instruction(tmp, Param(parameter=name, shape=fshape), [])
    ret = m.get_return()
    if ret is not None and any(a.shape.type in FP8_TYPES for a in ret.inputs):
        outs = [_convert(m, ret, a, DType.float_type) if a.shape.type in FP8_TYPES else a for a in ret.inputs]
        m.add_return(outs)


__all__ = [
    "QMAX",
    "QuantizeError",
    "autocast_fp8",
    "calibrate",
    "quantize_fp16",
    "quantize_fp8",
    "quantize_int8",
    "quantize_static",
]
