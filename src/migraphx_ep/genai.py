"""LLMs through ONNX Runtime GenAI (``onnxruntime-genai``) on MIGraphXExecutionProvider.

GenAI loads its own ONNX Runtime (the ``libonnxruntime.so`` of the ``onnxruntime`` wheel), not the one
``import onnxruntime`` gives Python, so the plugin library must be registered with GenAI too. GenAI
then reaches any provider name it has no built-in code for through ORT's plugin-EP API (the EP's
devices, ``SessionOptionsAppendExecutionProvider_V2``), with the options as given::

    import onnxruntime_genai as og
    from migraphx_ep import genai

    model = og.Model(genai.config("path/to/model", migraphx_target="ref"))   # registers once
    # or by hand:
    genai.register(og)
    config = og.Config("path/to/model")
    config.clear_providers()
    config.append_provider("MIGraphXExecutionProvider")
    config.set_provider_option("MIGraphXExecutionProvider", "fp16_enable", "1")

The provider must be named ``MIGraphXExecutionProvider``: GenAI matches plugin EPs by that name, and
the name ``MIGraphX`` (seed 002's ``genai_config.json``) makes stock GenAI ask ONNX Runtime for its
built-in ROCm EP, which a stock wheel does not have ("MIGraphX execution provider is not supported
in this build"). :func:`config` reads such a ``MIGraphX`` entry's options from the model's
``genai_config.json`` and applies them to this EP. GenAI keeps the KV cache in CPU memory here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from . import EP_NAME, get_library_path
from .ep.options import OptionError, check_provider_options

_lock = threading.Lock()
_registered: set[int] = set()  # id() of the onnxruntime_genai modules the library is registered with


def _import_og() -> ModuleType:
    try:
        import onnxruntime_genai as og
    except ImportError as e:
        raise ImportError(
            "migraphx_ep.genai needs ONNX Runtime GenAI: pip install onnxruntime-genai "
            f"(importing onnxruntime_genai failed: {e})"
        ) from e
    return og


def register(og: ModuleType | None = None) -> ModuleType:
    """Register the plugin library with GenAI's ONNX Runtime (once per process); returns ``og``."""
    og = _import_og() if og is None else og
    if not hasattr(og, "register_execution_provider_library"):
        raise RuntimeError(
            f"onnxruntime-genai {getattr(og, '__version__', '?')} cannot load plugin execution providers "
            "(no register_execution_provider_library); upgrade onnxruntime-genai"
        )
    with _lock:
        if id(og) not in _registered:
            try:
                og.register_execution_provider_library(EP_NAME, get_library_path())
            except RuntimeError as e:
                # Someone registered it already (by hand, with the same name): that is the goal.
                if "already registered" not in str(e):
                    raise
            _registered.add(id(og))
    return og


def provider_options(options: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, str]:
    """Options as GenAI wants them (strings), checked here so a bad key or value is an OptionError
    naming it before GenAI builds a session. Booleans become "1"/"0"; GenAI's short names
    (``fp16_enable``...) and the full ``migraphx_*`` names are both accepted."""
    merged = {**(options or {}), **kw}
    out = {str(k): ("1" if v else "0") if isinstance(v, bool) else str(v) for k, v in merged.items()}
    check_provider_options(out)
    return out


def config_entry(options: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, dict[str, str]]:
    """One element of ``genai_config.json``'s ``model.decoder.session_options.provider_options`` list."""
    return {EP_NAME: provider_options(options, **kw)}


def _is_migraphx(name: str) -> bool:
    # GenAI's own normalisation: case-insensitive, an "ExecutionProvider" suffix dropped.
    low = name.lower()
    return (low[: -len("executionprovider")] if low.endswith("executionprovider") else low) == "migraphx"


def file_options(model_dir: str | Path) -> dict[str, str]:
    """Options of the MIGraphX entries (``MIGraphX`` or ``MIGraphXExecutionProvider``) of the
    decoder's ``provider_options`` in ``model_dir/genai_config.json``."""
    path = Path(model_dir) / "genai_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir}: no genai_config.json (not an ONNX Runtime GenAI model folder)")
    try:
        doc = json.loads(path.read_text())
        entries = doc["model"]["decoder"].get("session_options", {}).get("provider_options", [])
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a GenAI config with model.decoder ({type(e).__name__}: {e})") from None
    found: dict[str, str] = {}
    for entry in entries if isinstance(entries, list) else ():
        for name, opts in entry.items() if isinstance(entry, dict) else ():
            if _is_migraphx(name) and isinstance(opts, dict):
                found.update({str(k): str(v) for k, v in opts.items() if k != "device_filtering_options"})
    try:
        check_provider_options(found)
    except OptionError as e:
        raise OptionError(f"{path}: {e}") from None
    return found


def config(
    model_dir: str | Path, options: Mapping[str, Any] | None = None, og: ModuleType | None = None, **kw: Any
):
    """An ``og.Config`` for ``model_dir`` whose decoder runs on this EP (and ORT's CPU EP for what it
    leaves). Options: those of the config file's MIGraphX entry, then ``options`` / keywords on top."""
    og = register(og)
    opts = {**file_options(model_dir), **provider_options(options, **kw)}
    cfg = og.Config(str(model_dir))
    cfg.clear_providers()
    cfg.append_provider(EP_NAME)
    for key, value in opts.items():
        cfg.set_provider_option(EP_NAME, key, value)
    return cfg


def model(
    model_dir: str | Path, options: Mapping[str, Any] | None = None, og: ModuleType | None = None, **kw
):
    """``og.Model`` of ``model_dir`` on this EP (see :func:`config`)."""
    og = register(og)
    return og.Model(config(model_dir, options, og, **kw))


def generate_greedy(
    model: Any, prompt: Sequence[int], new_tokens: int, og: ModuleType | None = None
) -> list[int]:
    """Exactly ``new_tokens`` greedy tokens after ``prompt`` (EOS is held off by ``min_length``)."""
    og = _import_og() if og is None else og
    ids = [int(t) for t in prompt]
    if not ids or new_tokens < 1:
        raise ValueError(
            f"generate_greedy needs a non-empty prompt and new_tokens >= 1 (got {len(ids)}, {new_tokens})"
        )
    params = og.GeneratorParams(model)
    total = len(ids) + new_tokens
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)][len(ids) :]


__all__ = [
    "config",
    "config_entry",
    "file_options",
    "generate_greedy",
    "model",
    "provider_options",
    "register",
]
