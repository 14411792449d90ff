"""Compilation targets: ``get_target('ref')`` (numpy oracle) and, where a GPU exists, ``'gpu'``."""

from __future__ import annotations

from .ref import RefTarget


class TargetError(ValueError):
    """An unknown target name, or a target this machine cannot provide."""


def get_target(name: str):
    if name == "ref":
        return RefTarget()
    if name == "gpu":
        raise TargetError("target 'gpu' is not available yet in this build (use 'ref')")
    raise TargetError(f"unknown target {name!r}; valid targets: 'ref', 'gpu'")


__all__ = ["RefTarget", "TargetError", "get_target"]
