"""Program files (``.mxr``): every module, the weights, a metadata dict and an optional compiled blob.

msgpack layout: ``MAGIC`` then a msgpack stream of ``bin`` sections::

    header | metadata | program | compiled | weight chunks...

Each section is a ``bin`` so a reader can skip what it does not need (``read_metadata`` never touches the
weights), and weights go straight from numpy buffers to the file and from the file into numpy buffers
(no intermediate copies of hundreds of MB). The header holds CRC32s of the metadata, program and compiled
sections; the program section holds each weight's size and CRC32. The json format is one object with the
same sections (weights base64) and no checksums, meant for small programs, diffs and hand edits.

Compiled programs: ``save`` stores the target name and, when the executable has ``serialize() -> bytes``
(or ``compiled=`` is given), that blob; ``load`` hands it to ``get_target(name).load_executable(prog,
blob)``. The ref target needs no blob: its executable is the stored (post-pass) program itself.
"""

from __future__ import annotations

import base64
import json
import mmap
import os
import sys
import tempfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

import msgpack
import numpy as np

from ..ir.program import Program
from ..switches import env_choice
from ..timing import stage
from .codec import MxrError, PathLike, decode_program, encode_program

MAGIC = b"\x89MXR-EP\n"  # high bit and newline catch text-mode mangling, as PNG's signature does
JSON_MAGIC = "migraphx_ep.mxr"
# 2: each weight's bytes start at a multiple of _ALIGN in the file (nil bytes before its first chunk's
# header), so a load maps them instead of copying; version 1 files (no padding) are read as well.
FORMAT_VERSION = 2
_READABLE = (1, 2)
_ALIGN = 64
_PAD = 0xC0  # msgpack nil: padding before a weight (the reader skips at most _ALIGN - 1 of them)
PRODUCER = "migraphx_ep"
FORMATS = ("msgpack", "json")
_CHUNK = 1 << 30  # msgpack bin32 holds < 4 GiB; larger weights are written as consecutive chunks
_BIN_LEN_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_PARALLEL_CRC = 1 << 20  # weights larger than this are checksummed on a thread pool


@dataclass
class MxrFile:
    """Everything a file holds; ``program`` is None when only the metadata was read."""

    program: Program | None
    metadata: dict[str, Any] = field(default_factory=dict)
    compiled: bytes | None = None
    target: str | None = None
    header: dict[str, Any] = field(default_factory=dict)


def producer_version() -> str:
    pkg = sys.modules.get("migraphx_ep")
    return str(getattr(pkg, "__version__", "0+unknown"))


# -- writing -------------------------------------------------------------------------------------------
def _bytes_of(arr: np.ndarray) -> memoryview:
    """A flat byte view (no copy) of a weight; ml_dtypes types have no buffer format of their own."""
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return memoryview(a.reshape(-1).view(np.uint8))


def _bin_header(n: int) -> bytes:
    """msgpack's bin8/16/32 marker for ``n`` bytes (the Packer has no public call for it)."""
    if n < 1 << 8:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def _check_metadata(metadata: dict | None, path: PathLike) -> dict:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise MxrError(path, "metadata must be a dict with string keys")
    return metadata


def _atomic_write(path: PathLike, write: Callable[[IO[bytes]], None]) -> None:
    """Write to a temporary file beside ``path`` and rename it over: readers never see half a file."""
    target = os.path.abspath(os.fspath(path))
    fd, tmp = tempfile.mkstemp(
        prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=os.path.dirname(target)
    )
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(target):
            mode = os.stat(target).st_mode & 0o777
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)  # mkstemp creates 0600; a saved program should look like any written file
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _header(target: str | None, fmt: str) -> dict[str, Any]:
    return {
        "format": fmt,
        "format_version": FORMAT_VERSION,
        "producer": PRODUCER,
        "producer_version": producer_version(),
        "byteorder": "little",
        "target": target,
    }


def save(
    prog: Program,
    path: PathLike,
    format: str = "msgpack",
    metadata: dict | None = None,  # noqa: A002
    compiled: bytes | None = None,
) -> None:
    """Write ``prog`` (compiled or not) to ``path`` atomically."""
    if format not in FORMATS:
        raise MxrError(path, f"unknown format {format!r}; valid: {', '.join(FORMATS)}")
    meta = _check_metadata(metadata, path)
    target = prog.target_name if prog.is_compiled() else None
    if compiled is None and prog.is_compiled():
        serialize = getattr(prog._exe, "serialize", None)
        compiled = serialize() if callable(serialize) else None
    spec, weights = encode_program(prog, path, binary=format == "msgpack")
    views = [_bytes_of(w) for w in weights]
    header = _header(target, format)
    if format == "json":
        doc = {
            "magic": JSON_MAGIC,
            **header,
            "metadata": meta,
            "program": spec,
            "compiled": None if compiled is None else base64.b64encode(compiled).decode("ascii"),
            "weights": [base64.b64encode(v).decode("ascii") for v in views],
        }
        try:
            text = json.dumps(doc, separators=(",", ":"))
        except (TypeError, ValueError) as e:
            raise MxrError(path, f"cannot write as json: {e}") from None
        _atomic_write(path, lambda f: f.write(text.encode("utf-8")))
        return
    spec["weights"] = [[v.nbytes, zlib.crc32(v)] for v in views]
    try:
        meta_b = msgpack.packb(meta, use_bin_type=True)
    except (TypeError, ValueError) as e:
        raise MxrError(path, f"metadata cannot be written: {e}") from None
    prog_b = msgpack.packb(spec, use_bin_type=True)
    comp_b = b"" if compiled is None else bytes(compiled)
    header["has_compiled"] = compiled is not None
    header["crc"] = {
        "metadata": zlib.crc32(meta_b),
        "program": zlib.crc32(prog_b),
        "compiled": zlib.crc32(comp_b),
    }

    def write(f: IO[bytes]) -> None:
        f.write(MAGIC)
        for section in (msgpack.packb(header, use_bin_type=True), meta_b, prog_b, comp_b):
            f.write(_bin_header(len(section)))
            f.write(section)
        at = f.tell()
        for v in views:
            for start in range(0, max(v.nbytes, 1), _CHUNK):
                piece = v[start : start + _CHUNK]
                head = _bin_header(piece.nbytes)
                pad = (-(at + len(head))) % _ALIGN if start == 0 else 0
                f.write(bytes([_PAD]) * pad + head)
                f.write(piece)
                at += pad + len(head) + piece.nbytes

    _atomic_write(path, write)


# -- reading -------------------------------------------------------------------------------------------
class _Reader:
    """Reads the ``bin`` sections of a msgpack stream, skipping or filling buffers without copies."""

    def __init__(self, f: IO[bytes], path: PathLike) -> None:
        self.f = f
        self.path = path
        self.size = os.fstat(f.fileno()).st_size

    def _exact(self, n: int, what: str) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise MxrError(self.path, f"truncated file: {what} ends early")
        return b

    def bin_len(self, what: str) -> int:
        tag = self._exact(1, what)[0]
        width = _BIN_LEN_BYTES.get(tag)
        if width is None:
            raise MxrError(self.path, f"corrupt file: {what} is not a binary section (byte 0x{tag:02x})")
        return int.from_bytes(self._exact(width, what), "big")

    def read(self, what: str) -> bytes:
        return self._exact(self.bin_len(what), what)

    def _skip_padding(self, what: str) -> None:
        """Past the nil bytes that align a weight (format 2); more than an alignment's worth is corrupt."""
        start = self.f.tell()
        head = self.f.read(_ALIGN)
        n = len(head) - len(head.lstrip(bytes([_PAD])))
        if n >= _ALIGN:
            raise MxrError(self.path, f"corrupt file: {what} is preceded by {n} or more padding bytes")
        self.f.seek(start + n)

    def locate(self, nbytes: int, what: str) -> list[tuple[int, int, int]]:
        """Where a weight of ``nbytes`` lies: (file offset, offset in the weight, bytes) per chunk, the
        file position moved past it (its bytes are read later, ``_read_weights``)."""
        pieces, done = [], 0
        self._skip_padding(what)
        while True:  # at least one chunk: an empty weight is written as one empty bin
            n = self.bin_len(what)
            if done + n > nbytes:
                raise MxrError(self.path, f"corrupt file: {what} is larger than recorded")
            at = self.f.tell()
            if at + n > self.size:
                raise MxrError(self.path, f"truncated file: {what} ends early")
            pieces.append((at, done, n))
            self.f.seek(n, os.SEEK_CUR)
            done += n
            if done == nbytes:
                return pieces


def _read_weights(
    f: IO[bytes], path: PathLike, records: list[tuple[int, int]], where: list[list[tuple[int, int, int]]]
) -> list[np.ndarray]:
    """The weights' bytes, each checked against its CRC-32 (large ones on a thread pool: zlib releases
    the GIL); the first bad or short weight is named.

    A weight stored in one piece at an aligned offset (every one a format 2 file holds) is a read-only
    view of the file mapped into memory: the page cache's own pages, a fault per 16 pages and none
    zeroed. Reading BERT-base's 220 MB into fresh buffers spent 50-90 ms of every load mostly in
    faulting in and zeroing those buffers' pages, and kept a second copy of the weights in the
    process. The mapping lives as long as a weight that views it; .mxr files are replaced by a rename,
    never rewritten in place, so what a load maps does not change under it. Other weights (split in
    chunks over 1 GiB, unaligned in a version 1 file, or ``MIGRAPHX_EP_MXR_MAP=0``) are read with
    ``os.preadv`` into their own buffers."""
    fd = f.fileno()
    mapped = _map(f) if any(_mappable(w) for w in where) else None
    own = [mapped is None or not _mappable(pieces) for pieces in where]  # read into a buffer of its own
    weights = [
        np.empty(n, dtype=np.uint8) if mine else np.frombuffer(mapped, np.uint8, n, pieces[0][0])  # type: ignore[arg-type]
        for (n, _), pieces, mine in zip(records, where, own, strict=True)
    ]

    def read(i: int) -> bool:
        buf = weights[i]
        if own[i]:
            view = memoryview(buf)
            for at, dst, n in where[i]:
                while n:
                    got = os.preadv(fd, [view[dst : dst + n]], at)
                    if got <= 0:
                        return False
                    at, dst, n = at + got, dst + got, n - got
        return zlib.crc32(buf) == records[i][1]

    big = [i for i, w in enumerate(weights) if w.nbytes > _PARALLEL_CRC]
    ok = {i: read(i) for i, w in enumerate(weights) if w.nbytes <= _PARALLEL_CRC}
    if big:
        with ThreadPoolExecutor(min(len(big), os.cpu_count() or 1, 16)) as pool:
            ok.update(zip(big, pool.map(read, big), strict=True))
    bad = [i for i in range(len(weights)) if not ok[i]]
    if bad:
        raise MxrError(path, f"corrupt file: weight {bad[0]} fails its checksum")
    return weights


def _mappable(pieces: list[tuple[int, int, int]]) -> bool:
    return len(pieces) == 1 and pieces[0][2] > 0 and pieces[0][0] % _ALIGN == 0


def _map(f: IO[bytes]) -> mmap.mmap | None:
    """``f`` mapped read-only, or None (switched off, or a file the system cannot map: then read)."""
    if env_choice("MIGRAPHX_EP_MXR_MAP", "1", ("0", "1")) == "0":
        return None
    try:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None


def _unpack(data: bytes, what: str, crc: int | None, path: PathLike) -> Any:
    if crc is not None and zlib.crc32(data) != crc:
        raise MxrError(path, f"corrupt file: the {what} section fails its checksum")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # noqa: BLE001 - msgpack raises several unrelated types on bad input
        raise MxrError(
            path, f"corrupt file: cannot decode the {what} section ({type(e).__name__}: {e})"
        ) from None


def _check_header(h: Any, fmt: str, path: PathLike) -> None:
    if not isinstance(h, dict) or h.get("producer") != PRODUCER:
        raise MxrError(path, "not a migraphx_ep program file (header has no migraphx_ep producer)")
    v = h.get("format_version")
    if v not in _READABLE:
        raise MxrError(
            path,
            f"format version {v} written by {PRODUCER} {h.get('producer_version')}; "
            f"this build ({producer_version()}) reads versions {', '.join(map(str, _READABLE))}",
        )
    if h.get("format") != fmt or h.get("byteorder") != "little":
        raise MxrError(path, f"corrupt header: format {h.get('format')!r}, byte order {h.get('byteorder')!r}")


def _detect(path: PathLike) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError as e:
        raise MxrError(path, f"cannot open: {e.strerror or e}") from None
    if head == MAGIC:
        return "msgpack"
    if head.lstrip()[:1] == b"{":
        return "json"
    if not head:
        raise MxrError(path, "empty file")
    if len(head) < len(MAGIC) and MAGIC.startswith(head):
        raise MxrError(path, "truncated file: the signature ends early")
    raise MxrError(path, f"not a migraphx_ep program file (starts with {head!r})")


def _read_msgpack(path: PathLike, with_program: bool) -> MxrFile:
    with stage("mxr read"):  # the file's bytes and their checksums
        found = _read_msgpack_sections(path, with_program)
    if isinstance(found, MxrFile):
        return found
    spec, weights, target, compiled, metadata, header = found
    return MxrFile(decode_program(spec, weights, target, compiled, path), metadata, compiled, target, header)


def _read_msgpack_sections(path: PathLike, with_program: bool) -> MxrFile | tuple:
    with open(path, "rb") as f:
        f.seek(len(MAGIC))
        r = _Reader(f, path)
        header = _unpack(r.read("header"), "header", None, path)
        _check_header(header, "msgpack", path)
        crc = header.get("crc")
        sections = ("metadata", "program", "compiled")
        if not isinstance(crc, dict) or not all(isinstance(crc.get(k), int) for k in sections):
            raise MxrError(path, "corrupt header: section checksums missing")
        target = header.get("target")
        if not isinstance(header.get("has_compiled"), bool) or not isinstance(target, str | None):
            raise MxrError(path, "corrupt header: bad compiled-program fields")
        metadata = _unpack(r.read("metadata"), "metadata", crc.get("metadata"), path)
        if not with_program:
            return MxrFile(None, metadata, None, target, header)
        spec = _unpack(r.read("program"), "program", crc.get("program"), path)
        comp = r.read("compiled section")
        if zlib.crc32(comp) != crc.get("compiled"):
            raise MxrError(path, "corrupt file: the compiled section fails its checksum")
        compiled = comp if header.get("has_compiled") else None
        try:
            records = [(int(n), int(c)) for n, c in spec["weights"]]
        except (KeyError, TypeError, ValueError):
            raise MxrError(path, "corrupt program section: bad weight table") from None
        where = [r.locate(nbytes, f"weight {i}") for i, (nbytes, _) in enumerate(records)]
        if f.read(1):
            raise MxrError(path, "corrupt file: unexpected data after the last weight")
        weights = _read_weights(f, path, records, where)
    return spec, weights, target, compiled, metadata, header


def _read_json(path: PathLike, with_program: bool) -> MxrFile:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise MxrError(path, f"corrupt or truncated json: {e}") from None
    if not isinstance(doc, dict) or doc.get("magic") != JSON_MAGIC:
        raise MxrError(path, "not a migraphx_ep program file (json without the mxr signature)")
    _check_header(doc, "json", path)
    target, metadata = doc.get("target"), doc.get("metadata") or {}
    if not with_program:
        return MxrFile(
            None, metadata, None, target, {k: v for k, v in doc.items() if k in _header(None, "json")}
        )
    try:
        weights = [np.frombuffer(base64.b64decode(w, validate=True), dtype=np.uint8) for w in doc["weights"]]
        compiled = None if doc.get("compiled") is None else base64.b64decode(doc["compiled"], validate=True)
        spec = doc["program"]
    except (KeyError, TypeError, ValueError) as e:
        raise MxrError(path, f"corrupt json program: {e}") from None
    return MxrFile(decode_program(spec, weights, target, compiled, path), metadata, compiled, target, doc)


def _read(path: PathLike, format: str | None, with_program: bool) -> MxrFile:  # noqa: A002
    if format is not None and format not in FORMATS:
        raise MxrError(path, f"unknown format {format!r}; valid: {', '.join(FORMATS)}")
    # The file's signature decides how it is read; ``format`` is only the caller's expectation.
    actual = _detect(path)
    return (_read_msgpack if actual == "msgpack" else _read_json)(path, with_program)


def load_file(path: PathLike, format: str | None = None) -> MxrFile:  # noqa: A002
    """Program, metadata, compiled blob and header of a file."""
    return _read(path, format, with_program=True)


def load(path: PathLike, format: str | None = "msgpack") -> Program:  # noqa: A002
    prog = load_file(path, format).program
    assert prog is not None
    return prog


def read_metadata(path: PathLike) -> dict[str, Any]:
    """The metadata dict alone; for msgpack files this reads neither the program nor the weights."""
    return _read(path, None, with_program=False).metadata


def read_header(path: PathLike) -> dict[str, Any]:
    return _read(path, None, with_program=False).header


__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MxrError",
    "MxrFile",
    "load",
    "load_file",
    "read_header",
    "read_metadata",
    "save",
]
