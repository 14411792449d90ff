"""Run-time compilation of generated CUDA C++ to device code (NVRTC), cached by hash.

A generated source is short: it includes the package's device headers (``kernels/include/*.cuh``, read
once by ``kernels/headers.py``), which NVRTC gets by name through ``nvrtcCreateProgram``; no CUDA
toolkit header is included (NVRTC wheels ship none). A compiled image is keyed by a hash of the source,
every header's text, the architecture and the options, in memory and, when ``MIGRAPHX_EP_KERNEL_CACHE``
names a folder, on disk, so a second compile of the same kernel costs a dictionary lookup and an edited
header never reuses an old image. Each outcome is counted for the process (``compile_count``,
``cache_stats``) and for the compile being timed (``timing``: stage ``nvrtc``, counts ``compiled``,
``cache hits``, ``disk hits``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ... import timing
from ...timing import carry, stage
from .backend import nvrtc
from .kernels import headers
from .kernels.headers import Headers
from .kernels.spec import KernelSpec

log = logging.getLogger("migraphx_ep.gpu")

_CACHE: dict[str, bytes] = {}
_LOCK = threading.Lock()
_STATS = {"compiled": 0, "cache hits": 0, "disk hits": 0}  # under _LOCK
DEFAULT_OPTIONS = ("--std=c++17", "-default-device")


class KernelCompileError(RuntimeError):
    """NVRTC rejected a generated kernel: the message holds its log and the source's first lines."""


def _check(result: tuple, what: str) -> tuple:
    err = result[0]
    if int(err) != 0:
        raise KernelCompileError(f"nvrtc {what} failed: {err!r}")
    return result[1:]


def source_key(source: str, arch: str, options: tuple[str, ...] = (), hdrs: Headers | None = None) -> str:
    """The image's key: ``source``, the headers' digest (``hdrs``, by default ``headers.HEADERS``),
    ``arch`` and the options. The key of a stored program's images too (``executable.py``)."""
    h = hashlib.sha256()
    for part in (source, (hdrs or headers.HEADERS).digest, arch, *DEFAULT_OPTIONS, *options):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _disk_dir() -> Path | None:
    d = os.environ.get("MIGRAPHX_EP_KERNEL_CACHE", "")
    return Path(d) if d else None


def cached_image(source: str, arch: str, key: str | None = None) -> bytes | None:
    """``source``'s image if this process compiled or loaded it already (counted as a cache hit), else
    None; ``key``: its ``source_key`` when the caller has it. A never-seen shape's kernels are nearly
    all such hits, and a lookup is cheaper than handing each to a compile thread."""
    key = key or source_key(source, arch)
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        _count("cache hits")
    return hit


def has_image(key: str) -> bool:
    """An image for ``key`` (a ``source_key``) is in this process's cache (not counted)."""
    with _LOCK:
        return key in _CACHE


def compile_source(source: str, arch: str, name: str = "kernel", options: tuple[str, ...] = ()) -> bytes:
    """Device code (a cubin for ``arch`` such as ``sm_90``) for ``source``, compiled at most once."""
    hdrs = headers.HEADERS  # one snapshot for the key and the compile
    key = source_key(source, arch, options, hdrs)
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        _count("cache hits")
        return hit
    disk = _disk_dir()
    if disk is not None and (disk / f"{key}.cubin").is_file():
        image = (disk / f"{key}.cubin").read_bytes()
        _count("disk hits")
    else:
        image = _compile(source, hdrs, arch, name, options)
        _count("compiled")
        if disk is not None:
            disk.mkdir(parents=True, exist_ok=True)
            tmp = disk / f"{key}.{os.getpid()}.tmp"
            tmp.write_bytes(image)
            os.replace(tmp, disk / f"{key}.cubin")
    with _LOCK:
        _CACHE[key] = image
    return image


def compile_images(specs: list[KernelSpec], arch: str, images: dict[str, bytes]) -> dict[str, str]:
    """Put every spec's image into ``images`` (by ``source_key``; a program's images): held already,
    from this process's cache, or compiled (or read from disk) on a pool of threads. Returns each
    source's key. The kernels that compile also compile their ``others`` (the same ops at other size
    classes) beside them, into this process's caches only, so later shapes find them compiled."""
    keys: dict[str, str] = {}
    todo: dict[str, KernelSpec] = {}
    with stage("nvrtc"):
        for sp in specs:
            if sp.source in keys:
                continue
            key = keys[sp.source] = source_key(sp.source, arch)
            if key in images:
                continue
            hit = cached_image(sp.source, arch, key)  # in memory: no thread for it
            if hit is not None:
                images[key] = hit
            else:
                todo[key] = sp
        if not todo:
            return keys
        others = {}
        for sp in todo.values():
            for o in _others(sp):
                k = source_key(o.source, arch)
                if k not in todo and not has_image(k):
                    others[k] = o
        work = carry(lambda sp: compile_source(sp.source, arch, sp.name))  # counts them
        spare = carry(lambda sp: _compile_spare(sp, arch))
        with ThreadPoolExecutor(min(len(todo) + len(others), max(os.cpu_count() or 1, 1), 16)) as ex:
            mapped = ex.map(work, todo.values())  # submitted first: this program needs them
            for o in others.values():
                ex.submit(spare, o)
            compiled = list(mapped)
        images.update(zip(todo.keys(), compiled, strict=True))
    return keys


def adopt_images(images: dict[str, bytes]) -> None:
    """Take a loaded program's images (by ``source_key``) into this process's cache: a later shape's
    kernel with the same source is then a cache hit, as it is after a compile here. Without this, every
    kernel of the first new shape after a model-cache load compiled again."""
    with _LOCK:
        for key, image in images.items():
            _CACHE.setdefault(key, image)


_later = threading.Lock()  # one background compile of variants at a time


def compile_others_later(specs: list[KernelSpec], arch: str) -> Future:
    """Compile, on a background thread, the variants (``others``) of ``specs`` that this process does not
    hold: for a program whose kernels came ready-made (from a .mxr), as ``compile_images`` compiles a
    kernel's variants only when it compiles the kernel. Later shapes then find them, as they would after
    a compile here, instead of compiling one on a Run's critical path. One at a time, on a daemon
    thread: it takes a core, never a Run's time, and never holds up the process's exit."""
    done: Future = Future()

    def work() -> None:
        try:
            with _later:
                compiled: set[str] = set()
                # One spec per distinct source: a program's steps repeat their layers' kernels.
                for sp in {sp.source: sp for sp in specs}.values():
                    for o in _others(sp):
                        k = source_key(o.source, arch)
                        if k not in compiled and not has_image(k):
                            compiled.add(k)
                            _compile_spare(o, arch)
            done.set_result(len(compiled))
        except BaseException as e:  # noqa: BLE001 - reported through the future
            done.set_exception(e)

    threading.Thread(target=work, name="migraphx-ep-variants", daemon=True).start()
    return done


def _others(spec: KernelSpec) -> list[KernelSpec]:
    """``spec``'s variants for other size classes; none where making them fails (a later shape that
    takes one then generates and compiles it itself, where its error then stops it)."""
    if spec.others is None:
        return []
    try:
        return spec.others()
    except Exception as e:  # noqa: BLE001 - the program at hand does not run them
        log.warning("kernel variants for other sizes of %s were not made (%s)", spec.name, e)
        return []


def _compile_spare(spec: KernelSpec, arch: str) -> None:
    """Compile a kernel only later shapes may take; one that fails costs those shapes a compile of their
    own (where its error then stops them), not the program at hand."""
    try:
        compile_source(spec.source, arch, spec.name)
    except Exception as e:  # noqa: BLE001 - the program at hand does not run it
        log.warning("a kernel variant for other sizes did not compile (%s); shapes that take it will", e)


def _count(outcome: str) -> None:
    with _LOCK:
        _STATS[outcome] += 1
    timing.count("nvrtc", outcome)


def compile_count() -> int:
    """How many kernels NVRTC really compiled in this process (cache hits excluded)."""
    with _LOCK:
        return _STATS["compiled"]


def cache_stats() -> dict[str, int]:
    """This process's ``compile_source`` outcomes: ``compiled``, ``cache hits`` (memory), ``disk hits``."""
    with _LOCK:
        return dict(_STATS)


def _compile(source: str, hdrs: Headers, arch: str, name: str, options: tuple[str, ...]) -> bytes:
    # Every header goes in (a few tens of KB): NVRTC reads only those the source, or a header, includes.
    texts = [t.encode() for t in hdrs.texts.values()]
    names = [n.encode() for n in hdrs.texts]
    created = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), len(texts), texts, names)
    (prog,) = _check(created, "create")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in DEFAULT_OPTIONS)]
        opts += [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            (size,) = _check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            head = "\n".join(source.splitlines()[:40])
            raise KernelCompileError(
                f"kernel {name!r} does not compile for {arch}:\n{log.decode(errors='replace')}\n"
                f"-- source (first lines) --\n{head}"
            )
        (size,) = _check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
        image = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, image), "get cubin")
        return image
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def nvrtc_available() -> str | None:
    """None when NVRTC loads, else why not."""
    try:
        _check(nvrtc.nvrtcVersion(), "version")
    except Exception as e:  # noqa: BLE001 - a missing library shows up as several error types
        return f"NVRTC is not usable: {e}"
    return None
