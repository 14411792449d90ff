"""Compiled-program files for the EP: model cache directory and save/load of compiled models.

Every file is found by, and checked against, a full SHA-256 key over everything that decides what
the program computes: the subgraph (ops, attributes, wiring), every weight's bytes, the input dims
and specialised input values, the compile options, the target and the package version. The key is
stored in the file's metadata and compared on load, so a file made for another model, shape or
option set is never run (the real EP's cache-key collisions), only reported and recompiled.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .. import mxr
from ..ir.program import Program
from .options import EpOptions

log = logging.getLogger("migraphx_ep")
# 2: weights larger than _BIG hashed on their own (in parallel), their digests fed in
# 3: the gpu target fuses layernorm and GEMM/convolution epilogues in passes (fused_* instructions), no
#    longer while lowering: a program stored before holds them unfused and would load and run slower
# 4: pointwise chains too (fused_pointwise): a program stored before would lower one kernel per op
# 5: channels-last convolutions are laid out by a pass (``layout`` instructions), no longer while
#    lowering: a program stored before would lower NCHW
KEY_VERSION = 5
_BIG = 1 << 20


def _feed(h: Any, v: Any) -> None:
    """Hash a nested value canonically (types and structure included, dict keys sorted)."""
    if isinstance(v, np.ndarray | np.generic):
        a = np.ascontiguousarray(v)
        h.update(f"nd{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a.reshape(-1).view(np.uint8)) if a.size else b"")
    elif isinstance(v, dict):
        h.update(b"{")
        for k in sorted(v, key=str):
            _feed(h, str(k))
            _feed(h, v[k])
        h.update(b"}")
    elif isinstance(v, list | tuple):
        h.update(b"[")
        for x in v:
            _feed(h, x)
        h.update(b"]")
    elif isinstance(v, bytes):
        h.update(b"b%d:" % len(v) + v)
    else:
        s = repr(v).encode()
        h.update(f"{type(v).__name__}{len(s)}:".encode() + s)


def graph_fingerprint(graph: dict) -> str:
    """Hash of a (fused) subgraph: nodes, attributes, wiring, value types and every weight's bytes."""
    from .. import __version__

    h = hashlib.sha256()
    _feed(h, ("migraphx-ep", __version__, KEY_VERSION))
    nodes = [
        {k: n.get(k) for k in ("op_type", "domain", "since_version", "inputs", "outputs", "attributes")}
        | {"subgraphs": {a: graph_fingerprint(g) for a, g in n.get("subgraphs", {}).items()}}
        for n in graph["nodes"]
    ]
    _feed(h, nodes)
    _feed(h, (graph["inputs"], graph["outputs"]))
    _feed(h, {n: graph.get("values", {}).get(n, {}).get("dtype") for n in graph["inputs"] + graph["outputs"]})
    _feed(h, _weight_digests(graph.get("initializers", {})))
    return h.hexdigest()


def _weight_digests(inits: dict) -> dict:
    """The initializers with every one over ``_BIG`` bytes replaced by its SHA-256 (marked as such): those
    are hashed on a thread pool (hashlib releases the GIL), since hashing BERT-base's 220 MB one after
    the other took 0.27 s of every session that loads it from the model cache."""
    big = {n: a for n, a in inits.items() if isinstance(a, np.ndarray) and a.nbytes > _BIG}
    if not big:
        return inits

    def digest(a: np.ndarray) -> bytes:
        b = np.ascontiguousarray(a)
        d = hashlib.sha256(f"nd{b.dtype.str}{b.shape}".encode())
        d.update(memoryview(b.reshape(-1).view(np.uint8)))
        return d.digest()

    with ThreadPoolExecutor(min(len(big), os.cpu_count() or 1, 16)) as pool:
        digests = dict(zip(big, pool.map(digest, big.values()), strict=True))
    return {n: ("sha256", digests[n]) if n in digests else a for n, a in inits.items()}


def program_key(
    fingerprint: str, dims: Iterable, values: dict[str, np.ndarray] | None, options: EpOptions, target: str
) -> str:
    h = hashlib.sha256()
    _feed(h, (fingerprint, list(dims), values or {}, options.compile_key(), target))
    return h.hexdigest()


class ProgramStore:
    """Where compiled programs are looked up before compiling and written after."""

    def __init__(self, options: EpOptions) -> None:
        self.options = options
        self.cache_dir = options.model_cache_dir or ""
        self.load_path = options.load_compiled_path if options.load_compiled_model else ""
        self.save_path = options.save_compiled_path if options.save_compiled_model else ""
        self.loads = 0
        self.saves = 0

    @property
    def enabled(self) -> bool:
        return bool(self.cache_dir or self.load_path or self.save_path)

    @staticmethod
    def _variant(path: str, key: str) -> str:
        stem, ext = os.path.splitext(path)
        return f"{stem}-{key[:16]}{ext or '.mxr'}"

    def _candidates_for_load(self, key: str) -> list[str]:
        paths = []
        if self.load_path:
            paths += [self.load_path, self._variant(self.load_path, key)]
        if self.cache_dir:
            paths.append(os.path.join(self.cache_dir, f"{key}.mxr"))
        return paths

    def lookup(self, key: str, name: str) -> Program | None:
        problems = []
        for path in self._candidates_for_load(key):
            if not os.path.isfile(path):
                continue
            try:
                found = mxr.read_metadata(path).get("migraphx_ep_key")
                if found != key:
                    problems.append(f"{path} was compiled for a different model, shape or options")
                    continue
                prog = mxr.load_file(path).program
            except mxr.MxrError as e:
                problems.append(str(e))
                continue
            if prog is None or not prog.is_compiled():
                problems.append(f"{path} holds no compiled program")
                continue
            self.loads += 1
            log.info("%s: loaded compiled program from %s", name, path)
            return prog
        if problems or self.load_path:
            log.warning(
                "%s: no usable compiled program (%s); compiling",
                name,
                "; ".join(problems) or f"nothing at {self.load_path}",
            )
        return None

    def _save_target(self, key: str) -> str:
        """Where a program is saved under ``save_path``: the path itself while it is free (or already
        holds this key, or is unreadable); else ``<stem>-<key>.mxr`` beside it. So a path keeps every
        program saved to it across sessions (shapes b1, b2, then b3, then b1 again all load), instead
        of each new program overwriting the previous one."""
        path = self.save_path
        if not os.path.isfile(path):
            return path
        try:
            found = mxr.read_metadata(path).get("migraphx_ep_key")
        except (OSError, mxr.MxrError):
            return path  # not a program anyone can load: take its place
        return path if found == key else self._variant(path, key)

    def store(self, key: str, prog: Program, name: str) -> None:
        targets = []
        if self.save_path:
            targets.append(self._save_target(key))
        if self.cache_dir:
            targets.append(os.path.join(self.cache_dir, f"{key}.mxr"))
        for path in targets:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                mxr.save(prog, path, metadata={"migraphx_ep_key": key, "subgraph": name})
                self.saves += 1
            except (OSError, mxr.MxrError) as e:
                # A cache that cannot be written must not fail inference; say so loudly.
                log.warning("%s: could not save compiled program to %s: %s", name, path, e)
