"""Sizes for symbolic dims: fixed ones (the driver, ``parse_onnx``) and the partition probe's.

The probe cannot know a symbolic dim's size before Run, so it makes sizes up (see ``probe_dims``) and
pins a symbol some node needs at one size (``probe_parse``).
"""

from __future__ import annotations

from typing import Any

from .parser import DimResolver, ParseResult, parse_graph


def fixed_dims(value: int) -> DimResolver:
    def resolve(name: str, axis: int, dim: Any) -> int:
        return value

    return resolve


def probe_dims(large: bool = False, pins: dict[str, int] | None = None) -> DimResolver:
    """A size per symbol for the partition probe: one name, one size; different names, different sizes
    (so unrelated dims are not mistaken for equal ones); an unnamed unknown dim is 1, which broadcasts.

    Small sizes (2, 3, 4...) fit models whose dims are bounded (a transformer's positions); ``large``
    sizes, odd multiples of 32 (96, 160, 224...), fit every pooling window and kernel and divide
    through five stride-2 stages, so a detector's downsample-upsample-concat paths line up as they do
    for real image sizes. The partitioner refuses only what both refuse (see ep/partition.py).
    ``pins`` fixes the size of the symbols a node needs at one size (see ``probe_parse``)."""
    sizes: dict[str, int] = {}
    pins = pins or {}

    def resolve(name: str, axis: int, dim: Any) -> int:
        if not dim:
            return 1
        if str(dim) in pins:
            return pins[str(dim)]
        n = len(sizes)
        return sizes.setdefault(str(dim), 32 * (3 + 2 * n) if large else 2 + n)

    return resolve


def probe_parse(
    graph: dict, large: bool = False, pins: dict[str, int] | None = None, **kw: Any
) -> ParseResult:
    """A tolerant parse at probe sizes, again with every symbol a node needs at one size (DimMismatch)
    pinned to it, until no new pin appears. ``pins`` (updated) carries them from one probe to the next."""
    pins = {} if pins is None else pins
    while True:
        res = parse_graph(graph, resolve_dim=probe_dims(large, pins), tolerant=True, **kw)
        new = {s: n for s, n in res.pins.items() if s not in pins}
        if not new:  # each round pins another symbol of the graph, so this ends
            return res
        pins.update(new)
