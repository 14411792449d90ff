"""ONNX's node test cases through ORT with the EP: nothing claimed may be wrong, >= 92% claimed-correct.

The denominator is what the *installed* ORT's CPU EP can run (it grows with each ORT release: 1,397 of
the 1,884 cases on ORT 1.31, 1,592 on 1.32), so the gate holds for whichever ORT pip resolved.
"""

from __future__ import annotations

import json

import onnxruntime as ort

from migraphx_ep import conformance


def test_node_conformance(tmp_path):
    out = tmp_path / "conformance.json"
    rc = conformance.main(["--json", str(out), "--show", ""])
    result = json.loads(out.read_text())
    counts = result["counts"]
    by_status: dict[str, list[str]] = {}
    for c in result["cases"]:
        by_status.setdefault(c["status"], []).append(c["name"])
    assert counts.get("claimed-wrong", 0) == 0, by_status.get("claimed-wrong")
    errors = set(by_status.get("ep-error", []))
    assert errors <= conformance.KNOWN_RUN_TIME_REFUSALS, errors
    assert rc == 0  # the documented state exits 0
    runnable = sum(v for k, v in counts.items() if k != "not-runnable")
    assert runnable > 1000, f"ORT {ort.__version__} ran only {runnable} cases: is the CPU EP broken?"
    assert counts["claimed-correct"] / runnable >= 0.92, (ort.__version__, counts)
    for c in result["cases"]:
        if c["status"] == "refused":
            assert c["detail"], f"{c['name']} refused without a reason"
