"""The device headers generated kernels include: ``include/*.cuh``, shipped in the package.

A generated source is short: ``#include "mx_prelude.cuh"`` (and the headers of its family), the
constants it specialises them with, and its kernel. NVRTC gets every header by name through
``nvrtcCreateProgram`` (``nvrtc.py``); the package ships no CUDA toolkit headers and the ``.cuh`` files
include none, so kernels stay self-contained. The texts are read once, at import, and ``HEADERS.digest``
(one hash of them all) goes into every compiled-image key: an edited header recompiles every kernel
rather than reusing an image built from the old text.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

INCLUDE_DIR = Path(__file__).with_name("include")  # also the host tests' ``g++ -I``
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.MULTILINE)


class Headers:
    """Header texts by include name, and ``digest``: a hash of every name and text."""

    def __init__(self, texts: Mapping[str, str]) -> None:
        self.texts: Mapping[str, str] = MappingProxyType(dict(sorted(texts.items())))
        h = hashlib.sha256()
        for name, text in self.texts.items():
            h.update(name.encode() + b"\0" + text.encode() + b"\0")
        self.digest = h.hexdigest()

    @classmethod
    def load(cls, folder: Path) -> Headers:
        return cls({p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.cuh")})


# Looked up as ``headers.HEADERS`` at call time (nvrtc.py), so a test can swap in edited texts.
HEADERS = Headers.load(INCLUDE_DIR)


def include(*names: str) -> str:
    """``#include`` lines for package headers; a name the package lacks fails here, not in NVRTC."""
    missing = [n for n in names if n not in HEADERS.texts]
    if missing:
        raise FileNotFoundError(f"no device header {missing} in {INCLUDE_DIR}")
    return "".join(f'#include "{n}"\n' for n in names)


def included(source: str) -> list[str]:
    """The names ``source`` includes, in order; ``<name>`` (a system header) comes back as ``<name>``."""
    return [name if quote == '"' else f"<{name}>" for quote, name in _INCLUDE.findall(source)]


def expand(source: str, headers: Headers | None = None) -> str:
    """``source`` with each package ``#include`` replaced by the header's text, the first time only (the
    guards would drop the rest): the whole translation unit NVRTC compiles, for reading or for tools
    that take one text."""
    texts = (headers or HEADERS).texts
    seen: set[str] = set()

    def inline(m: re.Match[str]) -> str:
        name = m.group(2)
        if m.group(1) != '"' or name not in texts:
            return m.group(0)
        if name in seen:
            return ""
        seen.add(name)
        return _INCLUDE.sub(inline, texts[name])

    return _INCLUDE.sub(inline, source)


__all__ = ["HEADERS", "INCLUDE_DIR", "Headers", "expand", "include", "included"]
