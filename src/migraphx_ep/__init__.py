"""migraphx-ep: the ONNX Runtime execution provider ``MIGraphXExecutionProvider``, in Python.

``import migraphx_ep`` (done for you when onnxruntime is imported, see ``_autoload``) registers the
plugin library with onnxruntime and lets ``InferenceSession(..., providers=["MIGraphXExecutionProvider"])``
reach it (see ``_routing``).

Set ``MIGRAPHX_EP_DISABLE_ROUTING=1`` to leave onnxruntime untouched at import (no registration, no
patching) and use the plugin the standard way::

    ort.register_execution_provider_library("MIGraphXExecutionProvider", migraphx_ep.get_library_path())
    so.add_provider_for_devices([migraphx_ep.get_ep_device()], {"key": "value"})
"""

from __future__ import annotations

import importlib.util
import os

__version__ = "0.1.0"

EP_NAME = "MIGraphXExecutionProvider"


def get_ep_name() -> str:
    return EP_NAME


def get_ep_names() -> list[str]:
    """Names of the EPs in the library (the PyPI plugin-EP package convention)."""
    return [EP_NAME]


def get_library_path() -> str:
    """Absolute path of the native library (the `_C` extension module is also the ORT plugin)."""
    spec = importlib.util.find_spec("migraphx_ep._C")
    if spec is None or spec.origin is None:
        raise ImportError("migraphx_ep: the native library migraphx_ep._C is missing (broken install?)")
    return os.path.abspath(spec.origin)


def get_ep_device(device_id: int = 0):
    """The onnxruntime OrtEpDevice of this EP (registers the library first if nobody did); with GPUs,
    the one whose memory is CUDA device ``device_id``'s."""
    from . import _routing

    return _routing.ep_device({"device_id": str(device_id)})


def _init() -> None:
    if importlib.util.find_spec("migraphx_ep._C") is None:
        # A source checkout without the native build: the compiler core (IR, frontend, ref target)
        # still works, but ORT cannot reach the EP, so say so instead of letting ORT skip it silently.
        import warnings

        warnings.warn(
            "migraphx_ep: native library _C not built; MIGraphXExecutionProvider is unavailable "
            "(the Python compiler core still works)",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    if os.environ.get("MIGRAPHX_EP_DISABLE_ROUTING", "") not in ("", "0"):
        return  # leave onnxruntime exactly as shipped
    from . import _C

    if _C.embedded():
        # The library started this interpreter inside a C/C++ host, whose ONNX Runtime already loaded
        # it: importing Python's onnxruntime would bring a second ORT into the process.
        return
    from . import _routing

    _routing.register_library()
    _routing.install()


_init()
