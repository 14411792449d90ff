"""Fusions of the gpu target: passes that replace a matched subgraph by one instruction owning it as a
submodule (STYLE §5-6), each lowered to one kernel or library call. ``fusion_passes`` is their order in
the gpu pipeline, after the shared simplifications (each one's matches read the simplified chains)."""

from ....passes.dead_code_elimination import DEAD_CODE_ELIMINATION as DCE
from ....passes.manager import Pass
from .attention import FUSE_ATTENTION, adopt_submodules, fuse_attention
from .conv_epilogue import FUSE_CONV_EPILOGUE, fuse_conv_epilogue
from .gemm_epilogue import FUSE_GEMM_EPILOGUE, fuse_gemm_epilogue
from .layernorm import FUSE_LAYERNORM, fuse_layernorm
from .pointwise import FUSE_POINTWISE, fuse_pointwise


def fusion_passes(use_blas: bool = True, use_dnn: bool = True) -> list[Pass]:
    """The fusions in order, each followed by dead-code elimination (a match leaves its chain dead). A
    library epilogue is fused only where that library loads (``use_blas``: cuBLASLt, ``use_dnn``:
    cuDNN). Pointwise chains last: what the others leave of them is one kernel each."""
    passes = (
        [FUSE_ATTENTION, FUSE_LAYERNORM]
        + [FUSE_GEMM_EPILOGUE] * use_blas
        + [FUSE_CONV_EPILOGUE] * use_dnn
        + [FUSE_POINTWISE]
    )
    return [q for p in passes for q in (p, DCE)]


__all__ = [
    "FUSE_ATTENTION",
    "FUSE_CONV_EPILOGUE",
    "FUSE_GEMM_EPILOGUE",
    "FUSE_LAYERNORM",
    "FUSE_POINTWISE",
    "adopt_submodules",
    "fuse_attention",
    "fuse_conv_epilogue",
    "fuse_gemm_epilogue",
    "fuse_layernorm",
    "fuse_pointwise",
    "fusion_passes",
]
