"""The subgraph fingerprint of the compile cache's key (ep/cache.py): every weight byte counts, whether a
weight is hashed inline or on the thread pool (over _BIG bytes), and its type and dims count too."""

from __future__ import annotations

import numpy as np
import pytest

from migraphx_ep.ep import cache


def graph(inits: dict) -> dict:
    return {"nodes": [], "inputs": ["x"], "outputs": ["y"], "values": {}, "initializers": inits}


@pytest.mark.parametrize("rows", [4, 2048])  # 4 x 512 floats inline; 2048 x 512 (4 MiB) on the pool
def test_any_weight_byte_dtype_or_dims_changes_the_fingerprint(rows):
    w = np.random.default_rng(0).standard_normal((rows, 512)).astype(np.float32)
    small = np.arange(6, dtype=np.float32)
    base = cache.graph_fingerprint(graph({"w": w, "s": small}))
    assert cache.graph_fingerprint(graph({"s": small, "w": w.copy()})) == base  # order and copies: same
    flipped = w.copy()
    flipped.reshape(-1).view(np.uint8)[-1] ^= 1  # one bit of the last byte
    assert cache.graph_fingerprint(graph({"w": flipped, "s": small})) != base
    assert cache.graph_fingerprint(graph({"w": w.reshape(-1, 256), "s": small})) != base  # dims
    assert cache.graph_fingerprint(graph({"w": w.view(np.int32), "s": small})) != base  # type, same bytes
    assert cache.graph_fingerprint(graph({"v": w, "s": small})) != base  # name


def test_big_weights_are_hashed_apart():
    big = np.zeros((cache._BIG // 4 + 1,), np.float32)
    digests = cache._weight_digests({"big": big, "small": np.zeros(3, np.float32)})
    assert digests["big"][0] == "sha256" and isinstance(digests["small"], np.ndarray)
