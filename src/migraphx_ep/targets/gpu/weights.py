"""Device copies of a subgraph's weights, shared by the programs compiled for its input shapes.

Every new input shape builds a new ``GpuExecutable``; each used to upload all of its weights again
(BERT-base fp16: ~220 MB per shape, and one more device copy of the weights per cached program). The
programs of one subgraph read the same host arrays: the ``WeightCache`` (``ir/weights.py``) gives every
compile the same literal per initializer and the same array per weight-only result. So a weight is
known here by its host memory, (address, bytes), and ``DeviceWeights`` (one per subgraph and device,
kept in that cache) maps it to where a device block already holds it: a program uploads, in one new
block, only the weights no live program has uploaded, and holds the blocks it reads.

Why the key is safe: an entry holds its host array, so those bytes cannot be freed and handed to
another array while the entry exists, and host weights are never written (read-only literal values,
cache-owned arrays). Blocks are held by the executables reading them and only weakly here: once the
last program reading a block is evicted, the block is freed and its entries go with it.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .memory import Storage, align

Alloc = Callable[[int], Any]  # nbytes -> a device block with ``ptr`` (freed when dropped)
# (block, [(offset, host bytes), ...]) -> each copied to block + offset, all landed on return
Upload = Callable[[Any, list[tuple[int, np.ndarray]]], None]
# A weight this large is copied to the device from its own array; smaller ones are packed into one host
# buffer first, so a program of many small weights still makes one transfer. Packing BERT-base's 220 MB
# (zeroing a buffer that size, then copying every weight into it) took longer than the upload.
_DIRECT = 1 << 20


@dataclass
class Placement:
    """Where one program's weights are on the device."""

    addresses: dict[int, int] = field(default_factory=dict)  # id(weight storage) -> device address
    blocks: list[Any] = field(default_factory=list)  # the device blocks read: hold them while running
    uploaded: int = 0  # bytes this program copied to the device (0: every weight was there)
    shared: int = 0  # weights found on the device already


def _cuda_alloc(nbytes: int) -> Any:
    from . import cuda

    return cuda.alloc(nbytes)


def _cuda_upload(device_id: int, block: Any, copies: list[tuple[int, np.ndarray]]) -> None:
    """Each copy through the shell's pinned staging where it applies (``csrc/host_staging.h``: a large
    pageable array, several host threads filling pinned buffers while the previous one's DMA runs), else
    the driver's copy; one stream for them all."""
    from . import cuda

    stream = cuda.Stream()
    try:
        from ... import _C

        copy = _C.copy_to_device
    except (ImportError, AttributeError):  # the extension is not built: the driver's copies
        for offset, host in copies:
            cuda.memcpy_htod(block.ptr + offset, host, stream)
        stream.sync()
        return
    for offset, host in copies:  # each returns with its bytes landed
        copy(block.ptr + offset, host, device_id, stream.handle)


class DeviceWeights:
    def __init__(self, alloc: Alloc = _cuda_alloc, upload: Upload | None = None, device_id: int = 0) -> None:
        self._alloc = alloc
        self._upload: Upload = upload or functools.partial(_cuda_upload, device_id)
        # (host address, bytes) -> (block, offset in it, the host array: keeps the address ours)
        self._entries: dict[tuple[int, int], tuple[weakref.ref, int, np.ndarray]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(1 for ref, _, _ in self._entries.values() if ref() is not None)

    def place(self, storages: Sequence[Storage]) -> Placement:
        """Device addresses for the weight ``storages`` of one program, uploading what is missing."""
        with self._lock:
            self._entries = {k: e for k, e in self._entries.items() if e[0]() is not None}
            out = Placement()
            blocks: dict[int, Any] = {}
            fresh: dict[tuple[int, int], int] = {}  # key -> offset in the new block (once per program)
            todo: list[tuple[int, np.ndarray, tuple[int, int] | None]] = []  # (offset, host, key)
            late: list[tuple[Storage, int]] = []  # storages in the new block, by offset
            total = 0
            missing: list[tuple[Storage, np.ndarray, tuple[int, int] | None]] = []
            for st in storages:
                host = np.asarray(st.value)
                key = (host.__array_interface__["data"][0], host.nbytes) if host.flags.c_contiguous else None
                entry = self._entries.get(key) if key is not None else None
                block = entry[0]() if entry is not None else None
                if block is not None:
                    out.addresses[id(st)] = block.ptr + entry[1]  # type: ignore[index]
                    blocks[id(block)] = block
                    out.shared += 1
                else:
                    missing.append((st, host, key))
            # Small weights first, so one packed transfer covers them (see _DIRECT).
            missing.sort(key=lambda m: m[1].nbytes >= _DIRECT)
            for st, host, key in missing:
                offset = fresh.get(key) if key is not None else None
                if offset is None:
                    offset, total = total, total + align(max(host.nbytes, 1))
                    todo.append((offset, host, key))
                    if key is not None:
                        fresh[key] = offset
                late.append((st, offset))
            if todo:
                block = self._alloc(total)
                raw = [
                    (offset, np.ascontiguousarray(host).reshape(-1).view(np.uint8))
                    for offset, host, _ in todo
                ]
                copies = [(offset, r) for offset, r in raw if r.nbytes >= _DIRECT]
                packed = [(offset, r) for offset, r in raw if r.nbytes < _DIRECT]
                if packed:  # the small ones in one transfer: they lie first, in [0, end of the last)
                    staging = np.zeros(packed[-1][0] + packed[-1][1].nbytes, np.uint8)
                    for offset, r in packed:
                        staging[offset : offset + r.size] = r
                    copies.insert(0, (0, staging))
                self._upload(block, copies)
                ref = weakref.ref(block)
                for offset, host, key in todo:
                    if key is not None:
                        self._entries[key] = (ref, offset, host)
                for st, offset in late:
                    out.addresses[id(st)] = block.ptr + offset
                blocks[id(block)] = block
                out.uploaded = total
            out.blocks = list(blocks.values())
            return out


__all__ = ["DeviceWeights", "Placement"]
