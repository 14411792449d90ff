"""Lowering: an IR module becomes a flat list of device steps over planned buffers.

Instructions map to steps one to one (MIGraphX's ``lowering``); what to fuse, the gpu pipeline's passes
in ``fuse/`` have decided by now:
1. fused instructions (attention, layernorm, GEMM and convolution epilogues, chains of pointwise ops)
   lower to one kernel or library call each; a pointwise kernel's one-element constants are literals in
   its source;
2. views (transpose, broadcast, slice, ...) produce no step: a value is (storage, byte offset, strided
   shape), and kernels read through the strides;
3. each remaining instruction becomes one step: a generated kernel, a cuBLASLt GEMM or a cuDNN conv.
Each value is written in the layout its shape says (``layout.py``'s pass put convolutions' activations
channels-last; ``conv_lowering.py`` lowers them and the ``layout`` copies); what stays here is the
copies a library call needs, and keeping a channels-last layout an int8/fp8 convolution wrote by
itself. The steps and buffers are ``steps.py``'s; storages get arena offsets from its
``plan_lowered``. What can be lowered at all is ``support.py``'s question.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable

import numpy as np

from ...ir.instruction import Instruction
from ...ir.module import Module
from ...ir.operation import Literal, ModuleOp, Op
from ...ir.shape import Shape
from ...ir.weights import WeightCache
from ...switches import env_choice
from . import kernels as K
from .conv_lowering import lower_conv, lower_layout
from .fuse.body import body_op
from .fuse.pointwise import is_pointwise, pointwise_groups
from .gqa import lower_gqa
from .kernel_memo import KernelMemo, body_key, op_key, pointwise_key
from .kernels.attention import attention_kernel
from .kernels.spec import KernelSpec, PwConst, PwExpr, PwInput, PwOp, Unsupported
from .layout import is_nhwc, matrix_layout
from .libcalls import GEMM_TYPES, dnn_conv
from .memory import Storage
from .quant import lower_quant
from .steps import Buf, GemmStep, KernelStep, Lowered, Step
from .support import IDENTITY
from .views import is_view, scalar_value, strided_reshape

log = logging.getLogger("migraphx_ep.gpu")


class Lowering:
    def __init__(
        self,
        module: Module,
        use_blas: bool,
        use_dnn: bool,
        weights: WeightCache | None = None,
    ) -> None:
        self.m = module
        self.weight_cache = weights  # host layouts of weights, shared with other shapes' compiles
        # Where a convolution's bias/residual/relu run: in cuDNN's fused call ("cudnn"), or as one
        # generated pointwise kernel after a plain cuDNN convolution ("kernel").
        self.conv_epilogue = env_choice("MIGRAPHX_EP_CONV_EPILOGUE", "cudnn", ("cudnn", "kernel"))
        self.use_blas = use_blas
        self.use_dnn = use_dnn
        self.bufs: dict[int, Buf] = {}
        self.steps: list[Step] = []
        self.storages: list[Storage] = []
        self.weights: list[Storage] = []
        self.inputs: dict[str, Buf] = {}
        self.kernels = KernelMemo()  # repeated layers: one generated source, renamed
        self._body_keys: dict[int, Hashable | None] = {}  # by body (the module outlives the lowering)
        self._n = 0

    def _conv_on_dnn(self, op: Op, out: Shape) -> bool:
        return self.use_dnn and dnn_conv(op, out)

    # -- storage ----------------------------------------------------------------------------------------
    def _new(self, shape: Shape, label: str, nhwc: bool = False) -> Buf:
        if nhwc and shape.ndim() == 4:
            shape = shape.as_channels_last()
        st = Storage(shape.bytes(), "arena", label=label)
        self.storages.append(st)
        return Buf(st, 0, shape)

    def _weight(self, value: np.ndarray, label: str, shape: Shape | None = None) -> Buf:
        arr = np.ascontiguousarray(value).reshape(np.shape(value))  # keeps 0-d values 0-d
        st = Storage(arr.nbytes, "weight", value=arr, label=label)
        self.weights.append(st)
        return Buf(st, 0, Shape.of(arr) if shape is None else shape)  # a literal's: its own, made once

    def _name(self, ins: Instruction) -> str:
        self._n += 1
        return f"k{self._n}_{ins.name}"

    # -- walking ------------------------------------------------------------------------------------------
    def run(self) -> Lowered:
        ret = None
        for ins in self.m.instructions:
            if ins.is_return():
                ret = ins
                continue
            self._lower(ins)
        outs: list[Buf | np.ndarray] = []
        returned = ret.inputs if ret is not None else [self.m.instructions[-1]]
        seen: set[int] = set()
        for r in returned:
            if r.is_literal():
                outs.append(np.array(r.op.value))  # type: ignore[attr-defined]
                continue
            b = self.bufs[id(r)]
            if not b.shape.standard() or b.storage.kind != "arena" or id(b.storage) in seen or b.offset:
                b = self._copy(b, "output")
            seen.add(id(b.storage))
            outs.append(b)
        # Only weights a step reads go to the device: a literal replaced by another layout (a conv filter
        # transposed to KRSC for NHWC) would otherwise be uploaded too, in the layout nothing reads.
        read = {id(b.storage) for s in self.steps for b in s.reads}
        weights = [w for w in self.weights if id(w) in read]
        return Lowered(self.steps, self.storages, self.inputs, outs, weights)

    def _lower(self, ins: Instruction) -> None:
        if ins.is_param():
            b = self._new(ins.shape.as_standard(), f"input {ins.op.parameter}")  # type: ignore[attr-defined]
            b.storage.kind = "input"
            self.inputs[ins.op.parameter] = b  # type: ignore[attr-defined]
            self.bufs[id(ins)] = b
        elif ins.is_literal():
            lit: Literal = ins.op  # type: ignore[assignment]
            self.bufs[id(ins)] = self._weight(lit.value, "literal", lit.compute_shape([]))
        elif is_view(ins):
            self.bufs[id(ins)] = self._view(ins)
        elif ins.name == "layout":  # layout.py's pass put it before a convolution
            lower_layout(self, ins)
        elif ins.name == "fused_pointwise":  # fuse/pointwise.py made it: one kernel for its chain
            self._fused_pointwise(ins)
        elif is_pointwise(ins):  # a lone pointwise op: a kernel of its own
            self._pointwise(ins, lambda a: False, ins.shape)
        elif ins.name == "reshape" or ins.name == "flatten" or ins.name == "contiguous":
            src = self.bufs[id(ins.inputs[0])]
            view = None if ins.name == "contiguous" else strided_reshape(src.shape, ins.shape.lens)
            if view is not None:  # a view after all, at the buffer's real strides: no copy
                self.bufs[id(ins)] = Buf(src.storage, src.offset, view)
            else:
                src = self._copy(src, ins.name)
                self.bufs[id(ins)] = Buf(src.storage, 0, ins.shape)
        elif ins.name == "bit_cast":  # the same bytes and strides, read as the target type
            src = self.bufs[id(ins.inputs[0])]
            self.bufs[id(ins)] = Buf(src.storage, src.offset, src.shape.with_type(ins.shape.type))
        elif ins.name == "dot" or ins.name == "fused_gemm":
            self._dot(ins)
        elif ins.name == "fused_attention":  # fuse/attention.py made it: one flash-attention kernel
            self._attention(ins)
        elif ins.name == "fused_layernorm":  # fuse/layernorm.py made it: one row kernel
            self._layernorm(ins)
        elif ins.name in ("quant_dot", "quant_convolution", "quantizelinear"):
            lower_quant(self, ins)
        elif ins.name == "group_query_attention":  # a tuple: its get_tuple_elem readers take the parts
            parts = lower_gqa(self, ins)
            for u in ins.outputs:
                self.bufs[id(u)] = parts[u.op.index]  # type: ignore[attr-defined]
        elif ins.name == "get_tuple_elem" and id(ins) in self.bufs:
            pass  # set with its tuple's steps
        elif ins.name == "fused_conv" or (ins.name == "convolution" and self._conv_on_dnn(ins.op, ins.shape)):
            lower_conv(self, ins)
        elif isinstance(ins.op, ModuleOp) or ins.module_args:
            raise Unsupported(f"{ins.name}: control flow does not run on the gpu target")
        else:
            self._generic(ins)

    def _view(self, ins: Instruction) -> Buf:
        src = self.bufs[id(ins.inputs[0])]
        if src.shape != ins.inputs[0].shape and ins.op.output_alias([src.shape]) != 0:
            # The buffer's layout (e.g. NHWC) is not one this view can reinterpret: copy it standard.
            src = self._copy(src, ins.name)
        offset = src.offset
        if ins.name == "slice":
            bounds = ins.op._bounds(ins.inputs[0].shape)  # type: ignore[attr-defined]
            offset += (
                sum(b * s for (b, _), s in zip(bounds, src.shape.strides, strict=True))
                * src.shape.type_size()
            )
        # The op's shape is relative to its input's layout; recompute it from the buffer's real strides
        # (equal unless the input was re-laid out by a copy).
        shape = ins.op.compute_shape([src.shape]) if src.shape != ins.inputs[0].shape else ins.shape
        return Buf(src.storage, offset, shape)

    def _read(self, ins: Instruction) -> Buf:
        return self.bufs[id(ins)]

    def _emit(self, step: Step) -> None:
        self.steps.append(step)

    def _derived(self, lit: Instruction, what: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
        """``make()``, computed from the literal ``lit`` alone: one array for every compile of the subgraph
        (so its device copy is shared too: ``weights.py``)."""
        if self.weight_cache is None:
            return make()
        return self.weight_cache.derive_array(what, lit.op, make)  # type: ignore[arg-type]

    def _copy(self, src: Buf, label: str) -> Buf:
        out = self._new(src.shape.as_standard(), label)
        expr = PwOp(IDENTITY, (PwInput(0),), src.shape.type)
        spec = self._pointwise_spec(f"k{len(self.steps)}_copy", expr, [src.shape], out.shape)
        self._emit(KernelStep(f"copy ({label})", [src], [out], spec=spec, expr=expr))
        return out

    # -- pointwise ------------------------------------------------------------------------------------------
    def _fused_pointwise(self, ins: Instruction) -> None:
        """A ``fused_pointwise`` (``fuse/pointwise.py``): its body as one expression; its parameters are
        the op's inputs, its one-element constants literals."""
        body = ins.module_args[0]
        for p, a in zip(body.get_parameters(), ins.inputs, strict=True):
            self.bufs[id(p)] = self.bufs[id(a)]
        root = body.get_return().inputs[0]  # type: ignore[union-attr]
        inner = lambda b: not b.is_param() and scalar_value(b) is None  # noqa: E731
        self.bufs[id(ins)] = self._pointwise(root, inner, ins.shape)

    def _pointwise(
        self, root: Instruction, inner: Callable[[Instruction], bool], layout: Shape | None = None
    ) -> Buf:
        """One kernel computing ``root`` from the instructions under it that are ``inner`` (named after
        ``root``, which, in a fused op's body, is the chain's last op), written in ``layout`` (the fused
        instruction's shape) where that is channels-last."""
        inputs: list[Buf] = []
        index: dict[int, int] = {}

        def build(ins: Instruction) -> PwExpr:
            if ins is root or inner(ins):
                return PwOp(ins.op, tuple(build(a) for a in ins.inputs), ins.shape.type)
            v = scalar_value(ins)
            if v is not None:
                return PwConst(v, ins.shape.type)
            key = id(ins)
            if key not in index:
                index[key] = len(inputs)
                inputs.append(self._read(ins))
            return PwInput(index[key])

        expr = build(root)
        nhwc = (layout is not None and layout.channels_last()) or _keeps_nhwc(root.shape, inputs)
        out = self._new(root.shape.as_standard(), root.name, nhwc)
        spec = self._pointwise_spec(self._name(root), expr, [b.shape for b in inputs], out.shape)
        self._emit(KernelStep(f"pointwise {root.name}", inputs, [out], spec=spec, expr=expr))
        self.bufs[id(root)] = out
        return out

    def _pointwise_spec(self, name: str, expr: PwExpr, inputs: list[Shape], out: Shape) -> KernelSpec:
        key = pointwise_key(expr, inputs, out)
        return self.kernels.spec(key, name, lambda n: K.pointwise_kernel(n, expr, inputs, out))

    def _attention(self, ins: Instruction) -> None:
        args = [self._read(a) for a in ins.inputs]
        out = self._new(ins.shape.as_standard(), "attention")
        shapes, body = [a.shape for a in args], ins.module_args[0]
        op = ins.op
        bk = self._body_keys.get(id(body))  # a body shared by every layer (ep/shape_template.py): once
        if id(body) not in self._body_keys:
            bk = self._body_keys[id(body)] = body_key(body)
        ok = op_key(op)
        key = None if ok is None or bk is None else ("attention", ok, bk, tuple(shapes), out.shape)
        make = lambda n: attention_kernel(n, op, shapes, out.shape, body)  # noqa: E731
        spec = self.kernels.spec(key, self._name(ins), make)
        info = {"modules": ins.module_args}  # the simulator runs the body
        self._emit(KernelStep("attention", args, [out], spec=spec, op=ins.op, args=info))
        self.bufs[id(ins)] = out

    def _layernorm(self, ins: Instruction) -> None:
        """A ``fused_layernorm`` (``fuse/layernorm.py``): one row kernel reading x, gamma and beta."""
        o = ins.op
        x, *extra = (self._read(a) for a in ins.inputs)
        rest = iter(extra)
        scale = next(rest) if o.scale else None  # type: ignore[attr-defined]
        bias = next(rest) if o.bias else None  # type: ignore[attr-defined]
        out = self._new(ins.shape.as_standard(), "layernorm")
        axis, eps = o.axis, float(o.epsilon)  # type: ignore[attr-defined]
        shapes = (x.shape, scale.shape if scale else None, bias.shape if bias else None, out.shape)
        spec = self.kernels.spec(
            ("layernorm", shapes, axis, repr(eps)),
            self._name(ins),
            lambda n: K.layernorm_kernel(n, *shapes, axis, eps),
        )
        info = {"axis": axis, "eps": eps, "scale": scale is not None, "bias": bias is not None}
        self._emit(KernelStep("layernorm", [x, *extra], [out], spec=spec, args=info))
        self.bufs[id(ins)] = out

    def _lower_body(self, ins: Instruction) -> None:
        """A fused op whose library call is missing here (a program optimised where it loads, or the
        conv epilogue switched to ``kernel``): its body, its parameters the op's inputs, its pointwise
        ops in the kernels ``fuse_pointwise`` would have made of them (the body itself stays the
        chain it stands for)."""
        body = ins.module_args[0]
        for p, a in zip(body.get_parameters(), ins.inputs, strict=True):
            self.bufs[id(p)] = self.bufs[id(a)]
        groups = pointwise_groups(body)
        for b in body.instructions:
            if b.is_return():
                self.bufs[id(ins)] = self.bufs[id(b.inputs[0])]
            elif id(b) in groups:  # a root: its group is one kernel
                self._pointwise(b, _member_of(groups[id(b)]))
            elif not b.is_param() and not is_pointwise(b):
                self._lower(b)

    def _generic(self, ins: Instruction) -> None:
        args = [self._read(a) for a in ins.inputs]
        if ins.name == "resize":  # its coordinate tables are data, so one source serves every size
            args.append(self._weight(K.resize_table(ins.op, args[0].shape), "resize table"))
        keeps_layout = ins.name in ("pooling", "pad") and (
            ins.shape.channels_last() or is_nhwc(args[0].shape)
        )
        out = self._new(ins.shape.as_standard(), ins.name, keeps_layout)
        shapes, op, ok = [a.shape for a in args], ins.op, op_key(ins.op)
        key = None if ok is None else ("op", ok, tuple(shapes), out.shape)
        spec = self.kernels.spec(key, self._name(ins), lambda n: K.kernel_for(n, op, shapes, out.shape))
        self._emit(KernelStep(ins.name, args, [out], spec=spec, op=ins.op))
        self.bufs[id(ins)] = out

    # -- GEMM ----------------------------------------------------------------------------------------------
    def _dot(self, ins: Instruction) -> None:
        """A ``dot``, or a ``fused_gemm`` (``fuse/gemm_epilogue.py``): its epilogue in the cuBLASLt call."""
        if ins.name == "fused_gemm" and not self.use_blas:
            return self._lower_body(ins)
        a, b = (self._read(x) for x in ins.inputs[:2])
        if not self.use_blas or ins.shape.type not in GEMM_TYPES:
            out = self._new(ins.shape.as_standard(), "dot")
            spec = K.gemm_kernel(self._name(ins), a.shape, b.shape, out.shape)
            self._emit(KernelStep("dot (generated)", [a, b], [out], spec=spec, op=ins.op))
            self.bufs[id(ins)] = out
            return
        *batch_lens, m, k = a.shape.lens
        n = b.shape.lens[-1]
        batch = math.prod(batch_lens)  # not np.prod: ~5 us a call, on every GEMM of every shape
        a = self._matrix_ready(a)
        b = self._matrix_ready(b)
        la, lb = matrix_layout(a.shape), matrix_layout(b.shape)
        out = self._new(ins.shape.as_standard(), "gemm")
        lc = (n, 1, m * n)
        # One big GEMM instead of `batch` small ones when B is shared and A's rows are evenly spaced.
        if batch > 1 and lb[2] == 0 and la[1] == 1 and la[2] == m * la[0]:
            m, batch = m * batch, 1
            la = (la[0], 1, 0)
            lc = (n, 1, 0)
        reads = [a, b, *(self._read(x) for x in ins.inputs[2:])]  # the bias, then the residual
        fused = ins.name == "fused_gemm"
        has_bias, has_res, relu = (fused and getattr(ins.op, k) for k in ("bias", "residual", "relu"))
        label = f"gemm {batch}x{m}x{n}x{k}" + "".join(
            f" +{x}" for x, on in (("bias", has_bias), ("residual", has_res), ("relu", relu)) if on
        )
        step = GemmStep(
            label, reads, [out], dtype=ins.shape.type, batch=batch, m=m, n=n, k=k, layouts=(la, lb, lc),
            has_bias=has_bias, has_residual=has_res, relu=relu,
        )  # fmt: skip
        self._emit(step)
        self.bufs[id(ins)] = out

    def _matrix_ready(self, buf: Buf) -> Buf:
        """A buffer cuBLASLt can read: batch dims collapse to one stride and a matrix dim is unit-stride."""
        if matrix_layout(buf.shape) is None:
            return self._copy(buf, "gemm operand")
        return buf


def _keeps_nhwc(out: Shape, reads: list[Buf]) -> bool:
    """An input of the output's dims is in a channels-last layout an int8/fp8 convolution wrote by itself
    (``quant.py``; the IR does not describe it): an elementwise kernel writes in it too, coalesced."""
    return any(is_nhwc(b.shape) and b.shape.lens == out.lens for b in reads)


def _member_of(group: list[Instruction]) -> Callable[[Instruction], bool]:
    ids = {id(g) for g in group}
    return lambda ins: id(ins) in ids


def lower(
    module: Module,
    use_blas: bool,
    use_dnn: bool,
    weights: WeightCache | None = None,
) -> Lowered:
    return Lowering(module, use_blas, use_dnn, weights).run()


__all__ = ["Lowering", "body_op", "lower"]
