"""The library steps of a gpu program (cuBLASLt GEMMs, cuDNN convolutions) bound to a context's
addresses, and their generated-kernel fallback where a library refuses: ``GpuExecutable``'s side of them.

Steps of one program that pose the same problem share one plan (repeated layers' GEMMs, a stage's
convolutions): a plan takes its pointers at each call, so the steps of one context may share it;
contexts, which may run concurrently, do not. Picks are stored per step (``_plans``, kept in the .mxr).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from ...timing import count, stage
from . import cuda
from .kernels.spec import KernelSpec, canonical
from .memory import align
from .nvrtc import source_key
from .steps import ConvStep, GemmStep
from .support import IDENTITY

if TYPE_CHECKING:
    from .context import RunContext

Launch = Callable[[int], None]


class LibrarySteps:
    """Mixed into ``GpuExecutable``, whose ``_compile_kernels`` and ``_module`` the fallback uses."""

    device: cuda.Device
    allow_tf32: bool
    quick: bool  # library picks without timing (tuning.QUICK)
    workspace_bytes: int
    _plans: dict[str, dict]
    _modules: dict[str, cuda.Module]
    _compile_kernels: Callable[[list[KernelSpec]], dict[str, str]]
    _module: Callable[[str], cuda.Module]

    def _bind_gemm(self, i: int, s: GemmStep, ctx: RunContext, plans: dict[Hashable, Any]) -> Launch:
        from . import blas, gemm_search

        key = f"gemm{i}"
        a, b = ctx.ptr(s.reads[0]), ctx.ptr(s.reads[1])
        rest = list(s.reads[2:])
        bias = ctx.ptr(rest.pop(0)) if s.has_bias else 0
        d = ctx.ptr(s.writes[0])
        c = ctx.ptr(rest.pop(0)) if s.has_residual else d
        la, lb, lc = (blas.MatLayout(*t) for t in s.layouts)
        tuned, alignment = self._plans.get(key), _alignment(a, b, c, d, bias)
        problem = ("gemm", s.dtype, s.batch, s.m, s.n, s.k, s.layouts, s.has_residual, s.has_bias, s.relu)
        p = plans.get(same := (*problem, alignment, repr(tuned)))
        if p is None:
            count("library search", "gemm")
            with stage("library search"):  # cuBLASLt heuristics and timing (none with a stored plan)
                p = plans[same] = gemm_search.plan_gemm(
                    s.dtype, s.batch, s.m, s.n, s.k, la, lb, lc,
                    beta=1.0 if s.has_residual else 0.0, bias=s.has_bias, relu=s.relu,
                    allow_tf32=self.allow_tf32, tuned=tuned, tune=not self.quick, alignment=alignment,
                )  # fmt: skip
        self._plans[key] = p.to_dict()
        self.workspace_bytes = max(self.workspace_bytes, align(p.workspace_size))
        return lambda stream: p.run(stream, a, b, c, d, bias, ctx.workspace_ptr())

    def _bind_conv(self, i: int, s: ConvStep, ctx: RunContext, plans: dict[Hashable, Any]) -> Launch:
        from . import dnn

        key = f"conv{i}"
        x, w = s.reads[0], s.reads[1]
        k = x.shape.ndim() - 2
        pads, strides, dil = s.op.attrs(k)  # type: ignore[attr-defined]
        y = s.writes[0]
        tuned, z_shape = self._plans.get(key), s.reads[-1].shape if s.has_residual else None
        group = s.op.group  # type: ignore[attr-defined]
        geometry = (tuple(pads), tuple(strides), tuple(dil), group)
        problem = ("conv", x.shape, w.shape, y.shape, *geometry, s.has_bias, s.relu, z_shape)
        p = plans.get(same := (*problem, repr(tuned)))
        if p is None:
            count("library search", "conv")
            with stage("library search"):  # cuDNN Find (none with a stored plan)
                p = plans[same] = dnn.plan_conv(
                    x.shape.type, x.shape, w.shape, y.shape, tuple(pads[:k]), tuple(pads[k:]),
                    tuple(strides), tuple(dil), group, bias=s.has_bias, relu=s.relu, residual=s.has_residual,
                    allow_tf32=self.allow_tf32, tuned=tuned, exhaustive=not self.quick, z=z_shape,
                )  # fmt: skip
        self._plans[key] = p.to_dict()
        self.workspace_bytes = max(self.workspace_bytes, align(p.workspace_size))
        rest = list(s.reads[2:])
        bias = ctx.ptr(rest.pop(0)) if s.has_bias else 0
        z = ctx.ptr(rest.pop(0)) if s.has_residual else 0
        xp, wp, yp = ctx.ptr(x), ctx.ptr(w), ctx.ptr(y)
        return lambda stream: p.run(stream, xp, wp, yp, bias, z, ctx.workspace_ptr())

    def _bind_fallback(self, s: GemmStep | ConvStep, ctx: RunContext) -> Launch:
        """The product on a generated kernel, then bias/residual/relu as one pointwise pass in place."""
        from . import kernels as K
        from .kernels.spec import PwInput, PwOp

        out = s.writes[0]
        a, b = s.reads[0], s.reads[1]
        if isinstance(s, GemmStep) and s.conv_op is not None:
            spec = K.conv_kernel(f"fb{id(s)}_conv", s.conv_op, a.shape, b.shape, out.shape)
        elif isinstance(s, GemmStep):
            spec = K.gemm_kernel(f"fb{id(s)}_gemm", a.shape, b.shape, out.shape)
        else:
            spec = K.conv_kernel(f"fb{id(s)}_conv", s.op, a.shape, b.shape, out.shape)
        specs = [(spec, [ctx.ptr(a), ctx.ptr(b), ctx.ptr(out)])]
        extra = s.reads[2:]
        relu = s.relu
        if extra or relu:
            from ...ir.operation import OPS

            expr = PwOp(IDENTITY, (PwInput(0),), out.shape.type)
            for j in range(len(extra)):
                expr = PwOp(OPS["add"](), (expr, PwInput(j + 1)), out.shape.type)
            if relu:
                expr = PwOp(OPS["relu"](), (expr,), out.shape.type)
            shapes = [out.shape] + [e.shape for e in extra]
            ep = K.pointwise_kernel(f"fb{id(s)}_epilogue", expr, shapes, out.shape)
            specs.append((ep, [ctx.ptr(out)] + [ctx.ptr(e) for e in extra] + [ctx.ptr(out)]))
        specs = [(canonical(sp), ptrs) for sp, ptrs in specs]
        self._compile_kernels([sp for sp, _ in specs])
        bound = []
        for sp, ptrs in specs:
            key = source_key(sp.source, self.device.arch)
            mod = self._modules.get(key) or self._modules.setdefault(key, self._module(key))
            bound.append(cuda.BoundLaunch(mod.function(sp.name), sp.grid, sp.block, sp.shared_bytes, ptrs,
                                          scalars=sp.args, scalar_bits=sp.arg_bits))  # fmt: skip

        def launch(stream: int) -> None:
            for f in bound:
                f(stream)

        return launch


def _alignment(*ptrs: int) -> int:
    """The largest power of two (at most 256) dividing every non-null pointer: views such as slices
    can start off a 256-byte boundary, and cuBLASLt must pick kernels that allow it."""
    a = 256
    for p in ptrs:
        while p and p % a:
            a //= 2
    return a


__all__ = ["Launch", "LibrarySteps"]
