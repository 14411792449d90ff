"""A fresh process's first call through ORT with the EP: import, session creation and first Run times,
and the compile's stage summary (the EP's INFO log line).

    python tools/first_call.py MODEL.onnx [--option key=value ...]

Symbolic dims are 1. Run it twice: the first process on a machine also pays cold file caches (cuDNN and
cuBLASLt are loaded from disk), the next ones do not.
"""

from __future__ import annotations

import argparse
import logging
import time

T0 = time.perf_counter()

import numpy as np  # noqa: E402 - imports are what is timed first
import onnxruntime as ort  # noqa: E402

import migraphx_ep  # noqa: E402, F401 - registers the EP (as the autoload hook would)

T_IMPORTS = time.perf_counter() - T0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--option", action="append", default=[], help="an EP option key=value")
    a = ap.parse_args(argv)
    opts = dict(o.split("=", 1) for o in a.option)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("migraphx_ep").setLevel(logging.INFO)  # the compile's stage summary
    t = time.perf_counter()
    providers = [("MIGraphXExecutionProvider", opts), "CPUExecutionProvider"]
    sess = ort.InferenceSession(a.model, providers=providers)
    t_session = time.perf_counter() - t
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        dtype = np.float16 if "float16" in i.type else np.int64 if "int64" in i.type else np.float32
        feeds[i.name] = np.zeros(shape, dtype)
    t = time.perf_counter()
    sess.run(None, feeds)
    print(f"imports {T_IMPORTS:.3f} s, session {t_session:.3f} s, first run {time.perf_counter() - t:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
