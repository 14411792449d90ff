"""Fusions of the gpu target: passes that replace a matched subgraph by one instruction owning it as a
submodule (STYLE §5-6), each lowered to one kernel."""

from .attention import FUSE_ATTENTION, adopt_submodules, fuse_attention

__all__ = ["FUSE_ATTENTION", "adopt_submodules", "fuse_attention"]
