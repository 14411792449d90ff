"""One result row of a bench script: printed as a JSON line, and appended to ``out`` when given."""

from __future__ import annotations

import json


def emit(rec: dict, out: str = "") -> None:
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
