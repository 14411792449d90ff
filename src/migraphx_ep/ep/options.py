"""Provider options and ORT_MIGRAPHX_* environment variables: parsed, validated, env wins.

Every key of the real MIGraphX EP is accepted (plus ORT-GenAI's short names and ``migraphx_target``).
Unknown keys and bad values are errors that name them; options whose feature is not built yet are
accepted and logged as "not yet effective" rather than silently ignored.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

log = logging.getLogger("migraphx_ep")


class OptionError(ValueError):
    """A provider option or ORT_MIGRAPHX_* variable with an unknown name or a bad value."""


def _bool(key: str, v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise OptionError(f"{key}={v!r}: expected 1/0 (or true/false)")


def _int(minimum: int = 0) -> Callable[[str, str], int]:
    def parse(key: str, v: str) -> int:
        try:
            n = int(str(v).strip(), 0)
        except ValueError:
            raise OptionError(f"{key}={v!r}: expected an integer") from None
        if n < minimum:
            raise OptionError(f"{key}={v!r}: must be >= {minimum}")
        return n

    return parse


def _str(key: str, v: str) -> str:
    return str(v)


def _path(key: str, v: str) -> str:
    s = str(v)
    if "\0" in s:
        # The OS would cut the path at the NUL and write somewhere the user did not name.
        raise OptionError(f"{key}={s!r}: a path cannot contain a NUL byte")
    return s


def _address(key: str, v: str) -> int:
    try:
        n = int(str(v).strip(), 0)
    except ValueError:
        raise OptionError(f"{key}={v!r}: expected a function address (decimal or 0x hex)") from None
    if n < 0:
        raise OptionError(f"{key}={v!r}: address must be non-negative")
    return n


def _arena(key: str, v: str) -> str:
    s = str(v).strip()
    table = {
        "0": "kNextPowerOfTwo",
        "1": "kSameAsRequested",
        "knextpoweroftwo": "kNextPowerOfTwo",
        "ksameasrequested": "kSameAsRequested",
    }
    if s.lower() not in table:
        raise OptionError(f"{key}={v!r}: expected kNextPowerOfTwo or kSameAsRequested (or 0/1)")
    return table[s.lower()]


def _target(key: str, v: str) -> str:
    s = str(v).strip().lower()
    if s not in ("gpu", "ref", "auto"):
        raise OptionError(f"{key}={v!r}: expected gpu, ref or auto")
    return s


@dataclass(frozen=True)
class Spec:
    field: str
    parse: Callable[[str, str], Any]
    key: str | None  # provider option name (None: env only)
    env: str | None  # ORT_MIGRAPHX_* name (None: option only)
    status: str  # "working" or "not yet": what the README's table says
    note: str = ""


SPECS: list[Spec] = [
    Spec(
        "device_id",
        _int(0),
        "device_id",
        None,
        "working",
        "selects the GPU; an explicit device_id (even 0) without a usable GPU is an error, never a ref run",
    ),
    Spec("fp16_enable", _bool, "migraphx_fp16_enable", "ORT_MIGRAPHX_FP16_ENABLE", "working"),
    Spec("bf16_enable", _bool, "migraphx_bf16_enable", "ORT_MIGRAPHX_BF16_ENABLE", "working"),
    Spec(
        "fp8_enable",
        _bool,
        "migraphx_fp8_enable",
        "ORT_MIGRAPHX_FP8_ENABLE",
        "working",
        "dot/convolution in fp8 E4M3 with the calibration table's scales (gpu: compute capability 8.9+)",
    ),
    Spec(
        "int8_enable",
        _bool,
        "migraphx_int8_enable",
        "ORT_MIGRAPHX_INT8_ENABLE",
        "working",
        "dot/convolution in int8 with the calibration table's scales (int32 accumulation)",
    ),
    Spec(
        "int8_calibration_table_name",
        _path,
        "migraphx_int8_calibration_table_name",
        "ORT_MIGRAPHX_INT8_CALIBRATION_TABLE_NAME",
        "working",
    ),
    Spec(
        "int8_use_native_calibration_table",
        _bool,
        "migraphx_int8_use_native_calibration_table",
        "ORT_MIGRAPHX_INT8_USE_NATIVE_CALIBRATION_TABLE",
        "working",
    ),
    Spec(
        "save_compiled_model",
        _bool,
        "migraphx_save_compiled_model",
        "ORT_MIGRAPHX_SAVE_COMPILED_MODEL",
        "working",
    ),
    Spec(
        "save_compiled_path",
        _path,
        "migraphx_save_compiled_path",
        "ORT_MIGRAPHX_SAVE_COMPILED_PATH",
        "working",
    ),
    Spec(
        "load_compiled_model",
        _bool,
        "migraphx_load_compiled_model",
        "ORT_MIGRAPHX_LOAD_COMPILED_MODEL",
        "working",
    ),
    Spec(
        "load_compiled_path",
        _path,
        "migraphx_load_compiled_path",
        "ORT_MIGRAPHX_LOAD_COMPILED_PATH",
        "working",
    ),
    Spec(
        "exhaustive_tune",
        _bool,
        "migraphx_exhaustive_tune",
        "ORT_MIGRAPHX_EXHAUSTIVE_TUNE",
        "working",
        "the gpu target always times cuBLASLt candidates and runs cuDNN Find",
    ),
    Spec(
        "mem_limit",
        _int(0),
        "migraphx_mem_limit",
        None,
        "working",
        "bytes of GPU memory ORT may allocate through the EP (inputs, outputs; 0: no limit); gpu only",
    ),
    Spec(
        "arena_extend_strategy",
        _arena,
        "migraphx_arena_extend_strategy",
        None,
        "working",
        "kNextPowerOfTwo rounds cached blocks up to a power of two, kSameAsRequested to 256 bytes",
    ),
    Spec(
        "external_alloc",
        _address,
        "migraphx_external_alloc",
        None,
        "working",
        "void* alloc(size_t): allocates the EP's GPU memory (with external_free)",
    ),
    Spec("external_free", _address, "migraphx_external_free", None, "working", "void free(void*)"),
    Spec(
        "external_empty_cache",
        _address,
        "migraphx_external_empty_cache",
        None,
        "working",
        "void empty_cache(void): called when the memory limit is reached",
    ),
    Spec("model_cache_dir", _path, "migraphx_model_cache_dir", "ORT_MIGRAPHX_MODEL_CACHE_PATH", "working"),
    Spec(
        "max_dynamic_batch",
        _int(0),
        "migraphx_max_dynamic_batch",
        "ORT_MIGRAPHX_MAX_DYNAMIC_BATCH",
        "working",
    ),
    Spec(
        "max_compiled_models",
        _int(1),
        "migraphx_max_compiled_models",
        "ORT_MIGRAPHX_MAX_COMPILED_MODELS",
        "working",
    ),
    Spec("target", _target, "migraphx_target", "ORT_MIGRAPHX_TARGET", "working"),
    Spec(
        "tf32_enable",
        _bool,
        "migraphx_tf32_enable",
        "ORT_MIGRAPHX_TF32_ENABLE",
        "working",
        "fp32 GEMM/conv may use TF32 tensor cores (default on, like ORT CUDA EP's use_tf32)",
    ),
    Spec("dump_model_ops", _bool, None, "ORT_MIGRAPHX_DUMP_MODEL_OPS", "working"),
]

# ORT-GenAI passes these short names (seed 002); the legacy cache variable is an alias.
ALIASES = {
    "fp16_enable": "migraphx_fp16_enable",
    "int8_enable": "migraphx_int8_enable",
    "exhaustive_tune": "migraphx_exhaustive_tune",
    "bf16_enable": "migraphx_bf16_enable",
    "fp8_enable": "migraphx_fp8_enable",
}
LEGACY_ENV = {"ORT_MIGRAPHX_CACHE_PATH": "ORT_MIGRAPHX_MODEL_CACHE_PATH"}
_BY_KEY = {s.key: s for s in SPECS if s.key}
_BY_ENV = {s.env: s for s in SPECS if s.env}


@dataclass(frozen=True)
class EpOptions:
    device_id: int = 0
    fp16_enable: bool = False
    bf16_enable: bool = False
    fp8_enable: bool = False
    int8_enable: bool = False
    int8_calibration_table_name: str = ""
    int8_use_native_calibration_table: bool = False
    save_compiled_model: bool = False
    save_compiled_path: str = "./compiled_model.mxr"
    load_compiled_model: bool = False
    load_compiled_path: str = "./compiled_model.mxr"
    exhaustive_tune: bool = False
    mem_limit: int = 0
    arena_extend_strategy: str = "kNextPowerOfTwo"
    external_alloc: int = 0
    external_free: int = 0
    external_empty_cache: int = 0
    model_cache_dir: str = ""
    max_dynamic_batch: int = 0
    max_compiled_models: int = 16
    target: str = "auto"
    tf32_enable: bool = True
    dump_model_ops: bool = False
    given: frozenset[str] = field(default=frozenset(), compare=False)  # fields set by the user
    # SHA-256 of the calibration table's bytes, set by the EP once it has read the table (int8/fp8):
    # other scales compute other programs, so the table's contents join every cache key.
    calibration_digest: str = ""

    def compile_key(self) -> dict[str, Any]:
        """The options that change what a compiled program computes (part of every cache key)."""
        return {
            "fp16": self.fp16_enable,
            "bf16": self.bf16_enable,
            "fp8": self.fp8_enable,
            "int8": self.int8_enable,
            "calibration": self.calibration_digest,
            "target": self.target,
            "tune": self.exhaustive_tune,
            "tf32": self.tf32_enable,
            "device": self.device_id,
        }


def valid_keys() -> list[str]:
    return sorted(_BY_KEY) + sorted(ALIASES)


def _parse_provider_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """field -> parsed value for every provider option; unknown keys and bad values are errors."""
    values: dict[str, Any] = {}
    for raw_key, raw in options.items():
        key = ALIASES.get(str(raw_key), str(raw_key))
        spec = _BY_KEY.get(key)
        if spec is None:
            raise OptionError(
                f"unknown MIGraphXExecutionProvider option {raw_key!r}; valid options: "
                + ", ".join(valid_keys())
            )
        values[spec.field] = spec.parse(str(raw_key), raw)
    return values


def check_provider_options(options: Mapping[str, Any]) -> None:
    """Validate provider options as the user wrote them, before they are handed to onnxruntime.

    ORT stores them as C strings, so by the time :func:`parse_options` sees them a value has been
    cut at its first NUL byte (``'cache\\0dir'`` arrives as ``'cache'``, ``'1\\0x'`` as ``'1'``) and
    the EP would silently use another path or value. Only the caller's Python dict still holds the
    whole string: ``migraphx_ep._routing`` checks it with :func:`reject_nul` before handing it on.
    Errors are :class:`OptionError`.
    """
    reject_nul(options)
    _parse_provider_options(options)


def reject_nul(options: Mapping[str, Any]) -> None:
    """OptionError for a NUL byte in an option name or value (see :func:`check_provider_options`)."""
    for raw_key, raw in options.items():
        if "\0" in str(raw_key):
            raise OptionError(f"MIGraphXExecutionProvider option name {str(raw_key)!r} contains a NUL byte")
        if "\0" in str(raw) and ALIASES.get(str(raw_key), str(raw_key)) in _BY_KEY:
            # Non-path values reject a NUL through their parsers too; this names the cause plainly.
            raise OptionError(f"{raw_key}={str(raw)!r}: an option value cannot contain a NUL byte")


def parse_options(options: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> EpOptions:
    """Provider options first, then ORT_MIGRAPHX_* env vars on top (env takes precedence).

    ``given`` records every field set through any route (option, GenAI short name, env variable), so
    an explicit ``device_id=0`` is told apart from the default.
    """
    env = os.environ if environ is None else environ
    values = _parse_provider_options(options)
    for legacy, name in LEGACY_ENV.items():
        if legacy in env and name not in env:
            values[_BY_ENV[name].field] = _BY_ENV[name].parse(legacy, env[legacy])
    for name, spec in _BY_ENV.items():
        if name in env:
            values[spec.field] = spec.parse(name, env[name])
    known = {f.name for f in fields(EpOptions)}
    opts = replace(EpOptions(), **{k: v for k, v in values.items() if k in known}, given=frozenset(values))
    _check_combinations(opts)
    _warn_not_effective(opts)
    return opts


def _check_combinations(o: EpOptions) -> None:
    if sum((o.fp16_enable, o.bf16_enable)) > 1:
        raise OptionError("migraphx_fp16_enable and migraphx_bf16_enable cannot both be set")
    if o.int8_enable and o.fp8_enable:
        raise OptionError("migraphx_int8_enable and migraphx_fp8_enable cannot both be set")
    # int8/fp8 without migraphx_int8_calibration_table_name is an error when the EP is created
    # (ep/calibration.py), where the table is read.


def _warn_not_effective(o: EpOptions) -> None:
    defaults = EpOptions()
    for spec in SPECS:
        if spec.status != "not yet" or spec.field not in o.given:
            continue
        if getattr(o, spec.field) == getattr(defaults, spec.field):
            continue
        name = spec.key or spec.env
        why = f" ({spec.note})" if spec.note else ""
        log.warning("MIGraphXExecutionProvider: option %s is accepted but not yet effective%s", name, why)
