"""ONNX node test cases the ref target claims whole but the gpu target's partition check refuses a node
of (no kernel, no decomposition), grouped by op type, with the first case and reason of each. Needs no
GPU: it runs the partitioner with ``instruction_supported`` for an sm_90 device.

    python tools/gpu_refusals.py [--cc 9.0]
"""

from __future__ import annotations

import argparse
import collections
import functools
import warnings

from onnx.backend.test.loader import load_model_tests

from migraphx_ep.ep.partition import partition
from migraphx_ep.frontend import model_to_dict
from migraphx_ep.targets.gpu.support import instruction_supported


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cc", default="9.0", help="compute capability MAJOR.MINOR (fp8 needs 8.9)")
    a = ap.parse_args(argv)
    major, minor = (int(x) for x in a.cc.split("."))
    check = functools.partial(instruction_supported, cc=(major, minor))
    per_op: collections.Counter[str] = collections.Counter()
    first: dict[str, str] = {}
    warnings.simplefilter("ignore")  # the cases' own generators warn about overflowing casts
    for case in load_model_tests(kind="node"):
        graph = model_to_dict(case.model)
        try:
            if partition(graph).refused:
                continue  # the ref refuses it too: not the gpu target's gap
            refused = partition(graph, check).refused
        except Exception as e:  # noqa: BLE001 - a case the frontend cannot read is not counted
            print(f"skipped {case.name}: {type(e).__name__}: {e}")
            continue
        if refused:
            op = case.model.graph.node[0].op_type
            per_op[op] += 1
            first.setdefault(op, f"{case.name}: {sorted(set(refused.values()))[0][:100]}")
    print(f"{sum(per_op.values())} cases the ref target claims whole and the gpu target does not")
    for op, n in per_op.most_common():
        print(f"{n:4d}  {op:<20} {first[op]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
