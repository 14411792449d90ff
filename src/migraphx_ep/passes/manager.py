"""Runs pass pipelines, with env switches to trace, time, disable passes and validate after each.

MIGRAPHX_EP_TRACE_PASSES=1     print the module after every pass that changed it
MIGRAPHX_EP_TIME_PASSES=1      log each pass's wall time (all passes together: stage ``passes`` of ``timing``)
MIGRAPHX_EP_DISABLE_PASSES=a,b skip passes by name
MIGRAPHX_EP_VALIDATE_PASSES=1  validate() the module after every pass (also on under pytest)
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..ir.module import Module, ModuleError
from ..timing import checkpoint, stage

log = logging.getLogger("migraphx_ep.passes")


@dataclass(frozen=True)
class Pass:
    name: str
    apply: Callable[[Module], bool]

    def __call__(self, m: Module) -> bool:
        return self.apply(m)


def _env_on(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() not in ("", "0", "false", "no", "off")


def run_passes(module: Module, passes: Sequence[Pass]) -> None:
    with stage("passes"):
        _run_passes(module, passes)


def _run_passes(module: Module, passes: Sequence[Pass]) -> None:
    disabled = {p.strip() for p in os.environ.get("MIGRAPHX_EP_DISABLE_PASSES", "").split(",") if p.strip()}
    trace = _env_on("MIGRAPHX_EP_TRACE_PASSES")
    timing = _env_on("MIGRAPHX_EP_TIME_PASSES")
    validate = _env_on("MIGRAPHX_EP_VALIDATE_PASSES") or "pytest" in sys.modules
    for p in passes:
        if p.name in disabled:
            continue
        checkpoint("passes")  # a background compile's passes give way here (ep/background.py)
        t0 = time.perf_counter()
        changed = p.apply(module)
        dt = time.perf_counter() - t0
        if timing:
            log.warning("pass %s on %s: %.3f ms (changed=%s)", p.name, module.name, dt * 1e3, changed)
        if trace and changed:
            print(f"--- after {p.name} ---\n{module}", file=sys.stderr)
        if validate:
            try:
                module.validate()
            except ModuleError as e:
                raise ModuleError(f"pass {p.name} broke module {module.name!r}: {e}") from e
