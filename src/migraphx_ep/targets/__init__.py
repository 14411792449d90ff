"""Compilation targets: ``get_target('ref')`` (numpy oracle) and, where a GPU exists, ``'gpu'``."""

from __future__ import annotations

from typing import Any

from .ref import RefTarget


class TargetError(ValueError):
    """An unknown target name, or a target this machine cannot provide."""


def get_target(name: str, **options: Any):
    """``options`` reach the gpu target (``device_id``, ``allow_tf32``); ref takes none."""
    if name == "ref":
        return RefTarget()
    if name == "gpu":
        from .gpu import GpuTarget, GpuUnavailable

        try:
            return GpuTarget(**options)
        except GpuUnavailable as e:
            raise TargetError(f"target 'gpu' is not available: {e}") from None
    raise TargetError(f"unknown target {name!r}; valid targets: 'ref', 'gpu'")


__all__ = ["RefTarget", "TargetError", "get_target"]
