"""Compiled-model compatibility: the string ORT stores in an EPContext model, and our verdict on it.

ORT asks the session's EP for a string when it writes an EPContext model (``OrtEp::
GetCompiledModelCompatibilityInfo``) and stores it in the model's metadata under
``ep_compatibility_info.MIGraphXExecutionProvider``. Before a session loads such a model it hands that
string to the factory (``OrtEpFactory::ValidateCompiledModelCompatibilityInfo``), as does
``get_model_compatibility_for_ep_devices``: EP_UNSUPPORTED stops the session there, with ORT's generic
message (so the reason is logged here first), PREFER_RECOMPILATION lets it go on with a warning.

The string (``format=1``)::

    MIGraphXExecutionProvider;format=1;version=0.1.0;target=ref;options=<16 hex>
    MIGraphXExecutionProvider;format=1;version=0.1.0;target=gpu;arch=sm_90;options=<16 hex>

``options`` is a digest of the compile options the programs depend on (:func:`options_record`, what
each EPContext record stores in full). The factory sees no session options, so it cannot judge them:
a session whose options differ finds out at Compile (``ep/epcontext.py``), which recompiles the
partition from the original model or fails naming the option.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any

from .cache import _feed
from .options import EpOptions, OptionError, parse_options

log = logging.getLogger("migraphx_ep")

EP_NAME = "MIGraphXExecutionProvider"
FORMAT = 1
_MAX_LENGTH = 1024  # ours are < 150 characters; anything far longer is not ours
# Options that do not change a ref-target program (they select or tune the GPU).
_GPU_ONLY = ("device", "tf32", "tune")
_FIELDS = {
    "format": re.compile(r"[0-9]{1,4}"),
    "version": re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}"),
    "target": re.compile(r"ref|gpu"),
    "arch": re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}"),
    "options": re.compile(r"[0-9a-f]{16}"),
}


class Compatibility(enum.IntEnum):
    """ORT's OrtCompiledModelCompatibility, value for value."""

    EP_NOT_APPLICABLE = 0
    EP_SUPPORTED_OPTIMAL = 1
    EP_SUPPORTED_PREFER_RECOMPILATION = 2
    EP_UNSUPPORTED = 3


class InfoError(ValueError):
    """A compatibility string this package cannot read (the message says what is wrong with it)."""


def package_version() -> str:
    from .. import __version__

    return str(__version__)


def options_record(options: EpOptions, target: str) -> dict[str, Any]:
    """The compile options a program depends on; the resolved target is recorded on its own (``auto``
    and ``ref`` give the same ref program), and GPU-only options do not matter to a ref program."""
    key = {k: v for k, v in options.compile_key().items() if k != "target"}
    return {k: v for k, v in key.items() if not (target == "ref" and k in _GPU_ONLY)}


def options_digest(options: EpOptions, target: str) -> str:
    h = hashlib.sha256()
    _feed(h, options_record(options, target))  # the cache keys' canonical hashing
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Info:
    version: str
    target: str
    options: str
    arch: str = ""  # the GPU architecture of a gpu program (sm_90), "" for ref

    def __str__(self) -> str:
        arch = [f"arch={self.arch}"] if self.target == "gpu" else []
        fields = [f"format={FORMAT}", f"version={self.version}", f"target={self.target}", *arch]
        return ";".join([EP_NAME, *fields, f"options={self.options}"])


def session_info(options: EpOptions, target: str) -> Info:
    """What a session with these options compiles here."""
    arch = ""
    if target == "gpu":
        from ..targets.gpu.cuda import Device

        arch = Device.get(options.device_id).arch
    return Info(package_version(), target, options_digest(options, target), arch)


def parse(text: str) -> Info:
    """The fields of a compatibility string; InfoError says what makes it unreadable."""
    if len(text) > _MAX_LENGTH:
        raise InfoError(f"{len(text)} characters long, more than any this EP writes")
    head, *parts = text.split(";")
    if head != EP_NAME:
        raise InfoError(f"it starts with {head[:40]!r}, not {EP_NAME!r}")
    fields: dict[str, str] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or key not in _FIELDS:
            raise InfoError(f"unknown field {part[:40]!r}")
        if key in fields:
            raise InfoError(f"field {key!r} appears twice")
        fields[key] = value
    if fields.get("format") != str(FORMAT):
        raise InfoError(f"format {fields.get('format')!r}; this package reads format {FORMAT}")
    want = ["version", "target", "options"] + (["arch"] if fields.get("target") == "gpu" else [])
    missing = [k for k in want if k not in fields]
    if missing:
        raise InfoError(f"it lacks {', '.join(missing)}")
    if "arch" in fields and fields.get("target") != "gpu":
        raise InfoError("a GPU architecture for a target other than gpu")
    for key, value in fields.items():
        if not _FIELDS[key].fullmatch(value):
            raise InfoError(f"bad {key} {value[:40]!r}")
    return Info(fields["version"], fields["target"], fields["options"], fields.get("arch", ""))


@dataclass(frozen=True)
class Machine:
    """What this package on this machine compiles: its version, the target ``auto`` resolves to here,
    and the architecture of every usable GPU (none: ``no_gpu`` says why)."""

    version: str
    target: str
    archs: tuple[str, ...] = ()
    no_gpu: str = ""


def this_machine() -> Machine:
    try:
        forced = parse_options({}).target  # ORT_MIGRAPHX_TARGET wins over every session's options
    except OptionError:
        forced = "auto"  # a bad variable is reported (as an error) by the session that reads it
    found = _gpu_archs()
    if isinstance(found, str):
        return Machine(package_version(), "ref", (), found)
    return Machine(package_version(), "ref" if forced == "ref" else "gpu", found)


def _gpu_archs() -> tuple[str, ...] | str:
    """Every usable GPU's architecture, read from device attributes (no context is created); or why
    there is none."""
    from ..targets.gpu import gpu_available

    reason = gpu_available(0)
    if reason is not None:
        return reason
    from ..targets.gpu.cuda import CudaError, check, cu, device_count

    attr = cu.CUdevice_attribute
    archs = []
    try:
        for ordinal in range(device_count()):
            dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
            cc = [
                check(cu.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute")
                for a in (
                    attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                    attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                )
            ]
            archs.append(f"sm_{int(cc[0])}{int(cc[1])}")
    except CudaError as e:
        return str(e)
    return tuple(archs)


def decide(text: str, here: Machine) -> tuple[Compatibility, str]:
    """Our verdict on a compiled model's string, and why when it is not OPTIMAL.

    | stored                   | here                        | verdict                                  |
    |--------------------------|-----------------------------|------------------------------------------|
    | unreadable / not ours    |                             | UNSUPPORTED                              |
    | target gpu               | no usable GPU               | UNSUPPORTED                              |
    | another package version  |                             | PREFER_RECOMPILATION                     |
    | gpu, arch X              | a GPU of another arch       | PREFER_RECOMPILATION                     |
    | target ref               | a usable GPU (auto -> gpu)  | PREFER_RECOMPILATION                     |
    | target gpu               | ORT_MIGRAPHX_TARGET=ref     | PREFER_RECOMPILATION                     |
    | options digest           | (not judged: session's)     | -                                        |
    | all the same             |                             | OPTIMAL                                  |
    """
    try:
        info = parse(text)
    except InfoError as e:
        # We cannot tell what its programs need, so we cannot promise they run.
        return Compatibility.EP_UNSUPPORTED, f"unreadable compatibility info: {e}"
    if info.target == "gpu" and not here.archs:
        # A gpu program's executable is kernel images and cuBLASLt/cuDNN plans: nothing here runs them.
        # (The original model could be compiled for ref, but ORT stops on UNSUPPORTED before Compile.)
        return (
            Compatibility.EP_UNSUPPORTED,
            f"compiled for the gpu target ({info.arch}), and this machine has no usable GPU: {here.no_gpu}",
        )
    why = []
    if info.version != here.version:
        # Programs made by another version are never run (the version is in every program key: passes
        # and op semantics change between versions). The session still works: Compile recompiles each
        # partition from the original model beside the compiled one, or fails naming both versions.
        why.append(f"made by migraphx-ep {info.version}, this is {here.version}")
    if info.target == "gpu" and any(a != info.arch for a in here.archs):
        # The program still runs: its stored kernel sources are recompiled for this architecture and the
        # library plans searched again at load (GpuTarget.load_executable), which is the compile an
        # EPContext model exists to skip. The factory cannot tell which GPU a session will take, so any
        # GPU of another architecture counts (ORT's rule: the worst device decides).
        others = sorted({a for a in here.archs if a != info.arch})
        why.append(f"compiled for {info.arch}, this machine has {', '.join(others)}")
    if info.target == "gpu" and here.target == "ref":
        # A GPU is here, but ORT_MIGRAPHX_TARGET=ref makes every session compile for ref: they recompile
        # from the original model (or fail naming the target).
        why.append("compiled for the gpu target, and ORT_MIGRAPHX_TARGET=ref here")
    if info.target == "ref" and here.target == "gpu":
        # A ref program runs anywhere (numpy), correctly but slowly; sessions here resolve auto to the
        # gpu target and recompile from the original model (or run it as is with migraphx_target=ref).
        why.append("compiled for the ref target (CPU), and this machine has a usable GPU")
    if why:
        return Compatibility.EP_SUPPORTED_PREFER_RECOMPILATION, "; ".join(why)
    return Compatibility.EP_SUPPORTED_OPTIMAL, ""


def validate(raw: bytes, here: Machine | None = None) -> Compatibility:
    """The factory's verdict on ``raw`` (the bytes ORT passed); never raises for bad input."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        verdict, why = Compatibility.EP_UNSUPPORTED, "unreadable compatibility info: not UTF-8"
    else:
        verdict, why = decide(text, here if here is not None else this_machine())
    if verdict != Compatibility.EP_SUPPORTED_OPTIMAL:
        # ORT's own message names no reason (and stops the session on UNSUPPORTED): say it here.
        log.warning("%s: compiled model %s: %s", EP_NAME, verdict.name, why)
    return verdict


__all__ = [
    "Compatibility",
    "Info",
    "InfoError",
    "Machine",
    "decide",
    "options_digest",
    "options_record",
    "parse",
    "session_info",
    "this_machine",
    "validate",
]
