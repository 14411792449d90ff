"""migraphx_ep.testing's feed generator, shared by the example, the tools and the benchmarks."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto
from onnx import helper as oh

from migraphx_ep.testing import random_feeds


def test_random_feeds_follow_types_and_dims():
    w = oh.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    graph = oh.make_graph(
        [],
        "g",
        [
            oh.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
            oh.make_tensor_value_info("flag", TensorProto.BOOL, [3, "seq"]),
            oh.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 4]),
            oh.make_tensor_value_info("w", TensorProto.FLOAT, [2]),  # an initializer: not fed
        ],
        [],
        [w],
    )
    dims = {"batch": 2, "seq": 5}
    feeds = random_feeds(oh.make_model(graph), lambda _axis, name: dims[name], np.random.default_rng(0))
    assert sorted(feeds) == ["flag", "ids", "x"]
    assert (
        feeds["ids"].shape == (2, 5)
        and feeds["ids"].dtype == np.int64
        and set(np.unique(feeds["ids"])) <= {0, 1}
    )
    assert feeds["flag"].shape == (3, 5) and feeds["flag"].dtype == np.bool_ and 0 < feeds["flag"].sum() < 15
    assert feeds["x"].shape == (2, 4) and feeds["x"].dtype == np.float16
