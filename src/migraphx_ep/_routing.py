"""Make ``providers=["MIGraphXExecutionProvider"]`` reach this plugin in a stock onnxruntime.

``MIGraphXExecutionProvider`` is also the name of ORT's built-in (ROCm-only) EP, so a stock wheel
silently skips it in ``providers=``. Plugin EPs are reached through EP devices instead: after
``register_execution_provider_library``, ``SessionOptions.add_provider_for_devices([device], options)``
runs our library, and the options arrive as session config entries ``ep.migraphxexecutionprovider.<key>``.

How ORT combines the two (onnxruntime_inference_collection.py, 1.31): if ``providers=`` is non-empty it
*replaces* whatever EP devices the SessionOptions carry (with a warning); if it is empty the session
uses the SessionOptions' EP devices, in the order they were added, with CPU as the implicit fallback.
So when our name is in ``providers=`` we move *every* listed provider onto the SessionOptions, in the
user's order (by its EP device when ORT lists one, else by name with ``SessionOptions.add_provider``;
names this onnxruntime does not have are skipped with ORT's own warning), and create the session with
an empty ``providers=``. ``sess.get_providers()`` then lists them in that order, ours included (first
when it came first). A failed CreateEp is re-raised as ORT's ``EPFail`` rather than the RuntimeError
that would make InferenceSession silently retry on CPU. A session without our name is left to ORT.

SessionOptions cannot be copied (no copy/pickle support in the pybind type), so:
- without ``sess_options`` we use a fresh SessionOptions per session (nothing visible leaks);
- with a user's ``sess_options`` the providers are added to *that object*. Re-using it for another
  session with the same providers is fine (we do not add them twice); re-using it with different
  providers raises, and a later session created from it *without* ``providers=`` runs on them too.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import onnxruntime as ort
from onnxruntime.capi import _pybind_state as _C
from onnxruntime.capi.onnxruntime_pybind11_state import EPFail as _EPFail

from . import EP_NAME, get_library_path
from .ep.options import OptionError, reject_nul

VENDOR = "migraphx-ep"  # OrtEpFactory::GetVendor, tells our EP devices from a built-in EP of the same name


class RoutingError(Exception):
    """Not a ValueError/RuntimeError on purpose: InferenceSession would swallow those and silently
    retry on CPU, which is exactly what asking for this EP by name must not do."""


_lock = threading.RLock()
_installed = False
# SessionOptions we attached providers to -> the providers, so a re-use does not attach them twice.
_attached: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _our_devices() -> list:
    return [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME and d.ep_vendor == VENDOR]


def register_library() -> None:
    """Register the plugin library with onnxruntime once (tolerates someone having done it already)."""
    with _lock:
        if _our_devices():
            return
        try:
            ort.register_execution_provider_library(EP_NAME, get_library_path())
        except Exception:
            if not _our_devices():  # a concurrent/earlier registration under our name is fine
                raise


def ep_device(options: dict[str, str] | None = None):
    """Our EpDevice for a session with ``options``: with a GPU there is one per CUDA device, each
    advertising that device's memory (its metadata "device_id"); the session's ``device_id`` option picks
    it. An id that matches none falls back to the first (the EP itself then reports the bad device_id)."""
    devices = _our_devices()
    if not devices:
        register_library()
        devices = _our_devices()
    if not devices:
        raise RuntimeError(f"{EP_NAME}: onnxruntime lists no EP device for the registered library")
    wanted = (options or {}).get("device_id", "0")
    for d in devices:
        if str(d.ep_metadata.get("device_id", "")) == str(wanted).strip():
            return d
    return devices[0]


def _normalize(providers: Any, provider_options: Any) -> list[tuple[str, dict]] | None:
    """[(name, options)] in order, or None when the arguments are not ours to interpret (ORT will
    validate them and raise its usual errors)."""
    if not isinstance(providers, Sequence) or isinstance(providers, str):
        return None
    if provider_options is not None:
        if not isinstance(provider_options, Sequence) or len(provider_options) != len(providers):
            return None
        if not all(isinstance(p, str) for p in providers):
            return None
        if not all(isinstance(o, dict) for o in provider_options):
            return None
        return [(p, dict(o)) for p, o in zip(providers, provider_options, strict=True)]
    entries = []
    for p in providers:
        if isinstance(p, str):
            entries.append((p, {}))
        elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], dict):
            entries.append((p[0], dict(p[1])))
        else:
            return None
    return entries


def _dedupe(entries: list[tuple[str, dict]]) -> list[tuple[str, dict[str, str]]]:
    """First occurrence of each name wins (as in ORT); option keys/values become strings."""
    seen, out = set(), []
    for name, opts in entries:
        if name not in seen:
            seen.add(name)
            out.append((name, {str(k): str(v) for k, v in opts.items()}))
    return out


def _attach(so: ort.SessionOptions, entries: list[tuple[str, dict[str, str]]]) -> None:
    devices = ort.get_ep_devices()
    built_in = _C.get_available_providers()  # the unpatched list
    for name, opts in entries:
        if name == EP_NAME:
            so.add_provider_for_devices([ep_device(opts)], opts)
            continue
        mine = [d for d in devices if d.ep_name == name]
        if mine:
            so.add_provider_for_devices(mine, opts)
            continue
        if name not in built_in:  # as ORT itself does: warn and go on without it
            warnings.warn(
                f"Specified provider '{name}' is not in available provider names."
                f"Available providers: '{', '.join([EP_NAME, *built_in])}'",
                stacklevel=4,
            )
            continue
        try:
            so.add_provider(name, opts)
        except Exception as e:
            raise RoutingError(
                f"{EP_NAME}: cannot combine '{name}' with {EP_NAME} in providers=: onnxruntime has no EP "
                f"device for it and rejects it by name ({e}). Use it in a separate session, or set "
                "MIGRAPHX_EP_DISABLE_ROUTING=1 and build the SessionOptions yourself."
            ) from e


def _session_options_for(user_so: Any, entries: list[tuple[str, dict[str, str]]]) -> ort.SessionOptions:
    if user_so is None:
        so = ort.SessionOptions()
        _attach(so, entries)
        return so
    with _lock:
        previous = _attached.get(user_so)
        if previous is None:
            _attach(user_so, entries)
            _attached[user_so] = entries
        elif previous != entries:
            raise RoutingError(
                f"{EP_NAME}: this SessionOptions already carries providers {[n for n, _ in previous]} "
                f"with their options from an earlier session; SessionOptions cannot be copied or reset, "
                "so pass a new SessionOptions for different providers/options."
            )
    return user_so


def _wrap_create(original):
    @functools.wraps(original)
    def _create_inference_session(self, providers, provider_options, *args, **kwargs):
        entries = _normalize(providers, provider_options)
        if not entries or all(name != EP_NAME for name, _ in entries):
            return original(self, providers, provider_options, *args, **kwargs)
        for name, opts in entries:
            if name == EP_NAME:
                try:  # before ORT turns the values into C strings, cutting them at a NUL byte
                    reject_nul(opts)
                except OptionError as e:
                    raise _EPFail(f"{EP_NAME}: {e}") from e
        user_so = self._sess_options
        self._sess_options = _session_options_for(user_so, _dedupe(entries))
        try:
            # Empty providers: ORT takes the EP devices from the SessionOptions (see module doc).
            return original(self, [], None, *args, **kwargs)
        except RuntimeError as e:
            # ORT reports a failed CreateEp as RuntimeError, which InferenceSession answers by silently
            # retrying on CPU. Asked for by name, this EP must fail loudly: re-raise as ORT's EPFail.
            if EP_NAME in str(e):
                raise _EPFail(str(e)) from e
            raise
        finally:
            if getattr(self, "_sess", None) is None:
                self._sess_options = user_so  # failed: leave the object as the user gave it

    _create_inference_session._migraphx_ep_routed = True
    return _create_inference_session


def _is_our_library(path: Any) -> bool:
    try:
        return os.path.samefile(os.fspath(path), get_library_path())
    except (OSError, TypeError, ImportError):
        return False


def _wrap_register(original):
    """Importing migraphx_ep already registered the library; the plain plugin-EP recipe
    (``register_execution_provider_library(name, migraphx_ep.get_library_path())``) must keep working."""

    @functools.wraps(original)
    def register_execution_provider_library(name, path, *args, **kwargs):
        if name == EP_NAME and _is_our_library(path) and _our_devices():
            return None
        return original(name, path, *args, **kwargs)

    register_execution_provider_library._migraphx_ep_routed = True
    return register_execution_provider_library


def _wrap_available(original):
    @functools.wraps(original)
    def get_available_providers(*args, **kwargs):
        names = list(original(*args, **kwargs))
        return names if EP_NAME in names else [EP_NAME, *names]

    get_available_providers._migraphx_ep_routed = True
    return get_available_providers


def install() -> None:
    """Patch onnxruntime once: InferenceSession routing, get_available_providers() and a tolerant
    register_execution_provider_library() for our own library."""
    global _installed
    with _lock:
        if _installed:
            return
        cls = ort.InferenceSession
        if not getattr(cls._create_inference_session, "_migraphx_ep_routed", False):
            cls._create_inference_session = _wrap_create(cls._create_inference_session)
        if not getattr(ort.get_available_providers, "_migraphx_ep_routed", False):
            ort.get_available_providers = _wrap_available(ort.get_available_providers)
        if not getattr(ort.register_execution_provider_library, "_migraphx_ep_routed", False):
            ort.register_execution_provider_library = _wrap_register(ort.register_execution_provider_library)
        _installed = True
