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

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .memory import Storage, align

Alloc = Callable[[int], Any]  # nbytes -> a device block with ``ptr`` (freed when dropped)
Upload = Callable[[Any, np.ndarray], None]  # (block, host bytes) -> the bytes copied into the block


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


def _cuda_upload(block: Any, host: np.ndarray) -> None:
    from . import cuda

    stream = cuda.Stream()
    cuda.memcpy_htod(block.ptr, host, stream)
    stream.sync()


class DeviceWeights:
    def __init__(self, alloc: Alloc = _cuda_alloc, upload: Upload = _cuda_upload) -> None:
        self._alloc, self._upload = alloc, upload
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
            for st in storages:
                host = np.asarray(st.value)
                key = (host.__array_interface__["data"][0], host.nbytes) if host.flags.c_contiguous else None
                entry = self._entries.get(key) if key is not None else None
                block = entry[0]() if entry is not None else None
                if block is not None:
                    out.addresses[id(st)] = block.ptr + entry[1]  # type: ignore[index]
                    blocks[id(block)] = block
                    out.shared += 1
                    continue
                offset = fresh.get(key) if key is not None else None
                if offset is None:
                    offset, total = total, total + align(max(host.nbytes, 1))
                    todo.append((offset, host, key))
                    if key is not None:
                        fresh[key] = offset
                late.append((st, offset))
            if todo:
                block = self._alloc(total)
                staging = np.zeros(total, np.uint8)  # one transfer, however many small weights
                for offset, host, _ in todo:
                    raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
                    staging[offset : offset + raw.size] = raw
                self._upload(block, staging)
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
