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
# 6: a large weight's digest is the SHA-256 of its _PIECE-byte pieces' digests (hashed in parallel); the
#    nodes are one repr of plain tuples (``_nodes_record``)
KEY_VERSION = 6
_BIG = 1 << 20
_PIECE = 4 << 20
_PRIMITIVE = (str, int, float, bool, type(None))


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
    elif isinstance(v, list | tuple) and all(type(x) in _PRIMITIVE for x in v):
        # The bytes the general case below would feed, joined first: node input and output lists are
        # most of a graph's values, and one update per list instead of one call per name halves the
        # fingerprint of a large graph (BERT-base: 11,000 calls).
        h.update(b"[" + b"".join(_scalar(x) for x in v) + b"]")
    elif isinstance(v, list | tuple):
        h.update(b"[")
        for x in v:
            _feed(h, x)
        h.update(b"]")
    elif isinstance(v, bytes):
        h.update(b"b%d:" % len(v) + v)
    else:
        h.update(_scalar(v))


def _scalar(v: Any) -> bytes:
    s = repr(v).encode()
    return f"{type(v).__name__}{len(s)}:".encode() + s


def graph_fingerprint(graph: dict) -> str:
    """Hash of a (fused) subgraph: nodes, attributes, wiring, value types and every weight's bytes."""
    from .. import __version__

    h = hashlib.sha256()
    _feed(h, ("migraphx-ep", __version__, KEY_VERSION))
    h.update(_nodes_record(graph["nodes"]))
    _feed(h, (graph["inputs"], graph["outputs"]))
    _feed(h, {n: graph.get("values", {}).get(n, {}).get("dtype") for n in graph["inputs"] + graph["outputs"]})
    _feed(h, _weight_digests(graph.get("initializers", {})))
    return h.hexdigest()


def _nodes_record(nodes: list[dict]) -> bytes:
    """The nodes as one ``repr`` of plain tuples: op, domain, opset, wiring, attributes by name and the
    fingerprints of subgraphs. ``repr`` of tuples of str, bytes, int, float, bool and None is exact and
    tells the types apart (``1``, ``1.0``, ``True``, ``'1'``); an array is recorded by dtype, dims and
    digest, anything else by type name and ``repr``. One C-level ``repr`` instead of a Python call per
    value: BERT-base's 539 nodes took 40 ms of every session's key on the H100 host that way."""
    return repr(
        [
            (
                n.get("op_type"),
                n.get("domain"),
                n.get("since_version"),
                tuple(n.get("inputs", ())),
                tuple(n.get("outputs", ())),
                tuple(sorted((str(k), _plain(v)) for k, v in (n.get("attributes") or {}).items())),
                tuple(sorted((str(a), graph_fingerprint(g)) for a, g in (n.get("subgraphs") or {}).items())),
            )
            for n in nodes
        ]
    ).encode()


def _plain(v: Any) -> Any:
    if type(v) in _PRIMITIVE or type(v) is bytes:
        return v
    if isinstance(v, list | tuple):
        return tuple(_plain(x) for x in v)
    if isinstance(v, np.ndarray | np.generic):
        a = np.ascontiguousarray(v)
        return ("nd", a.dtype.str, a.shape, hashlib.sha256(a.reshape(-1).view(np.uint8)).hexdigest())
    return (type(v).__name__, repr(v))


def _weight_digests(inits: dict) -> dict:
    """The initializers with every one over ``_BIG`` bytes replaced by a digest (marked as such): the
    SHA-256 of its dtype and dims and of the SHA-256s of its ``_PIECE``-byte pieces, which are hashed on a
    thread pool (hashlib releases the GIL). Hashing BERT-base's 220 MB one weight after the other took
    0.27 s of every session that loads it from the model cache; a weight per thread still left its
    47 MB embedding table on one thread."""
    big = {n: a for n, a in inits.items() if isinstance(a, np.ndarray) and a.nbytes > _BIG}
    if not big:
        return inits
    flat = {n: memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) for n, a in big.items()}
    pieces = [(n, start) for n, b in flat.items() for start in range(0, b.nbytes, _PIECE)]

    def digest(piece: tuple[str, int]) -> bytes:
        name, start = piece
        return hashlib.sha256(flat[name][start : start + _PIECE]).digest()

    with ThreadPoolExecutor(min(len(pieces), os.cpu_count() or 1, 16)) as pool:
        done = list(pool.map(digest, pieces))
    parts: dict[str, list[bytes]] = {n: [] for n in big}
    for (name, _), d in zip(pieces, done, strict=True):
        parts[name].append(d)  # in order: map keeps the pieces' order
    digests = {
        n: hashlib.sha256(f"nd{a.dtype.str}{a.shape}".encode() + b"".join(parts[n])).digest()
        for n, a in big.items()
    }
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
