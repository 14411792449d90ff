"""Host builds of generated kernel sources for the tests that run them without a GPU: g++ with the
package's device headers on the include path, one shared library per source."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from migraphx_ep.targets.gpu.kernels.headers import HEADERS, INCLUDE_DIR

GXX = shutil.which("g++")


def host_library(source: str, tmp: Path, flags: Sequence[str] = ()) -> ctypes.CDLL:
    """``source`` (a shim, a kernel, a runner) built as a shared library in ``tmp`` and loaded. Named by
    the hash of the source and the headers: dlopen hands back a library it has loaded for a path, so a
    new text needs a new name, and a text built before is not built again."""
    key = hashlib.sha256((HEADERS.digest + source).encode()).hexdigest()[:16]
    src, lib = tmp / f"h{key}.cpp", tmp / f"h{key}.so"
    if not lib.exists():
        src.write_text(source)
        cmd = [GXX or "g++", "-std=c++17", "-O1", "-w", *flags, "-shared", "-fPIC", "-I", str(INCLUDE_DIR)]
        done = subprocess.run([*cmd, "-o", str(lib), str(src)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"g++ failed:\n{done.stderr[:4000]}")
    return ctypes.CDLL(str(lib))


__all__ = ["GXX", "host_library"]
