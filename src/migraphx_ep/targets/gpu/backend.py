"""Where the driver and NVRTC bindings come from.

NVIDIA's ``cuda.bindings`` (driver, nvrtc) first. hip-python's CUDA-interop package exposes the same
names as ``cuda.cuda`` / ``cuda.nvrtc`` on AMD; that path is written for but not verified on AMD hardware.
Importing this module never touches a GPU: a machine without one fails only when a call is made.
"""

from __future__ import annotations

try:
    from cuda.bindings import driver, nvrtc  # type: ignore[import-not-found]

    BINDINGS = "cuda.bindings"
except ImportError:  # pragma: no cover - exercised only where hip-python-as-cuda is installed
    try:
        from cuda import cuda as driver  # type: ignore[import-not-found,no-redef]
        from cuda import nvrtc  # type: ignore[import-not-found,no-redef]

        BINDINGS = "cuda (hip-python interop)"
    except ImportError:
        driver = None  # type: ignore[assignment]
        nvrtc = None  # type: ignore[assignment]
        BINDINGS = ""

__all__ = ["BINDINGS", "driver", "nvrtc"]
