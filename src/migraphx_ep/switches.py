"""Debugging and tuning switches from the environment (the EP's and the gpu target's): a value a switch
does not know is an error naming the variable, never a silent default (nor a bare ``int()`` traceback)."""

from __future__ import annotations

import os


def env_choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip().lower() or default
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
    return value


def env_int(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = minimum - 1
    if n < minimum:
        raise ValueError(f"{name}={raw!r}: expected an integer >= {minimum}")
    return n
