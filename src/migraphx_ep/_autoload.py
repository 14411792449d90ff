"""Auto-load: import ``migraphx_ep`` right after ``onnxruntime``, so that
``InferenceSession(..., providers=["MIGraphXExecutionProvider"])`` works without ``import migraphx_ep``.

How: the wheel installs ``migraphx_ep_autoload.pth`` at the site-packages root. At interpreter start
``site`` runs its single ``import ...`` line, which (unless the environment variable
``MIGRAPHX_EP_NO_AUTOLOAD`` is set, to any value) locates this file *without importing the package*
(that would import onnxruntime eagerly), executes it as the module ``_migraphx_ep_autoload`` and calls
:func:`install`.

:func:`install` only puts a tiny finder at the front of ``sys.meta_path``. It ignores every import but
``onnxruntime``; for that one it fetches the real spec from the other finders and wraps its loader, so
that once onnxruntime has fully executed, ``migraphx_ep`` is imported (registering the plugin library
and installing the name routing, see ``migraphx_ep._routing``). The finder then removes itself.

Nothing here may break the interpreter or onnxruntime: if ``migraphx_ep`` fails to import, the error
is logged (logger ``"migraphx_ep"``, with traceback) and onnxruntime stays usable as shipped.
"""

from __future__ import annotations

import sys

TARGET = "onnxruntime"
PACKAGE = "migraphx_ep"


def _log_failure() -> None:
    import logging

    logging.getLogger(PACKAGE).warning(
        "%s could not be loaded after %s: MIGraphXExecutionProvider is unavailable "
        "(set MIGRAPHX_EP_NO_AUTOLOAD=1 to skip auto-loading)",
        PACKAGE,
        TARGET,
        exc_info=True,
    )


def _import_package() -> None:
    if PACKAGE in sys.modules:  # imported already, or importing now (it imports onnxruntime itself)
        return
    try:
        __import__(PACKAGE)
    except Exception:
        _log_failure()


class _Loader:
    """Wraps onnxruntime's own loader; anything but exec_module goes straight to it."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name: str):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        # Hand the module its real loader before it runs, so onnxruntime never sees this wrapper.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)  # errors importing onnxruntime propagate untouched
        uninstall()
        _import_package()


class _Finder:
    _migraphx_ep_autoload = True  # marker: the class may exist twice if this file runs twice

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET or self._busy:
            return None
        self._busy = True
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)  # the other finders (we are busy: we pass)
        except Exception:
            return None
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Arrange for ``migraphx_ep`` to be imported as soon as ``onnxruntime`` is."""
    try:
        if TARGET in sys.modules:
            _import_package()
        elif not any(getattr(f, "_migraphx_ep_autoload", False) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
    except Exception:
        _log_failure()


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "_migraphx_ep_autoload", False)]
