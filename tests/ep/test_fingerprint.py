"""The subgraph fingerprint of the compile cache's key (ep/cache.py): every weight byte counts, whether a
weight is hashed inline or on the thread pool (over _BIG bytes), and its type and dims count too."""

from __future__ import annotations

import numpy as np
import pytest

from migraphx_ep.ep import cache


def graph(inits: dict) -> dict:
    return {"nodes": [], "inputs": ["x"], "outputs": ["y"], "values": {}, "initializers": inits}


# 4 x 512 floats inline; 2048 x 512 (4 MiB, one piece) and 5000 x 512 (three pieces, the last short) on
# the pool
@pytest.mark.parametrize("rows", [4, 2048, 5000])
def test_any_weight_byte_dtype_or_dims_changes_the_fingerprint(rows):
    w = np.random.default_rng(0).standard_normal((rows, 512)).astype(np.float32)
    small = np.arange(6, dtype=np.float32)
    base = cache.graph_fingerprint(graph({"w": w, "s": small}))
    assert cache.graph_fingerprint(graph({"s": small, "w": w.copy()})) == base  # order and copies: same
    for at in (0, cache._PIECE - 1, cache._PIECE, -1):  # a bit of the first, last byte of a piece
        if at >= w.nbytes:
            continue
        flipped = w.copy()
        flipped.reshape(-1).view(np.uint8)[at] ^= 1
        assert cache.graph_fingerprint(graph({"w": flipped, "s": small})) != base
    assert cache.graph_fingerprint(graph({"w": w.reshape(-1, 256), "s": small})) != base  # dims
    assert cache.graph_fingerprint(graph({"w": w.view(np.int32), "s": small})) != base  # type, same bytes
    assert cache.graph_fingerprint(graph({"v": w, "s": small})) != base  # name


def test_big_weights_are_hashed_apart():
    big = np.zeros((cache._BIG // 4 + 1,), np.float32)
    digests = cache._weight_digests({"big": big, "small": np.zeros(3, np.float32)})
    assert digests["big"][0] == "sha256" and isinstance(digests["small"], np.ndarray)


def test_a_list_of_names_hashes_as_its_elements_one_by_one():
    """The fast path for lists of plain values feeds the bytes the general case feeds: the EPContext
    compatibility strings (ep/compat.py) hash with ``_feed`` too, and must not change."""
    import hashlib

    values = ["input_ids", "", 3, 2.5, True, None]
    fast, slow = hashlib.sha256(), hashlib.sha256()
    cache._feed(fast, values)
    slow.update(b"[")
    for v in values:
        cache._feed(slow, v)
    slow.update(b"]")
    assert fast.digest() == slow.digest()
    nested, flat = hashlib.sha256(), hashlib.sha256()
    cache._feed(nested, [values, np.arange(3)])  # not all plain: the general case, element by element
    flat.update(b"[")
    cache._feed(flat, values)
    cache._feed(flat, np.arange(3))
    flat.update(b"]")
    assert nested.digest() == flat.digest()


def test_every_part_of_a_node_changes_the_fingerprint():
    """The nodes are hashed as one record (``_nodes_record``): ops, opsets, wiring, each attribute's
    value and type, tensor attributes' bytes and subgraphs all count; the order of attributes does not."""
    t = np.arange(4, dtype=np.float32)

    def fp(**change) -> str:
        node = {
            "op_type": "Foo",
            "domain": "",
            "since_version": 13,
            "inputs": ["x", "w"],
            "outputs": ["y"],
            "attributes": {"axis": 1, "alpha": 0.5, "value": t, "mode": "linear", "pads": [0, 1]},
            "subgraphs": {},
        }
        node.update(change)
        return cache.graph_fingerprint({**graph({}), "nodes": [node]})

    base = fp()
    assert (
        fp(attributes={"pads": [0, 1], "mode": "linear", "value": t.copy(), "alpha": 0.5, "axis": 1}) == base
    )
    flipped = t.copy()
    flipped.view(np.uint8)[0] ^= 1
    body = {**graph({}), "nodes": []}
    changes = [
        {"op_type": "Bar"},
        {"domain": "com.microsoft"},
        {"since_version": 14},
        {"inputs": ["w", "x"]},
        {"outputs": ["z"]},
        {"attributes": {"axis": 1.0, "alpha": 0.5, "value": t, "mode": "linear", "pads": [0, 1]}},
        {"attributes": {"axis": True, "alpha": 0.5, "value": t, "mode": "linear", "pads": [0, 1]}},
        {"attributes": {"axis": 1, "alpha": -0.5, "value": t, "mode": "linear", "pads": [0, 1]}},
        {"attributes": {"axis": 1, "alpha": 0.5, "value": flipped, "mode": "linear", "pads": [0, 1]}},
        {
            "attributes": {
                "axis": 1,
                "alpha": 0.5,
                "value": t.astype(np.float64),
                "mode": "linear",
                "pads": [0, 1],
            }
        },
        {"attributes": {"axis": 1, "alpha": 0.5, "value": t, "mode": "nearest", "pads": [0, 1]}},
        {"attributes": {"axis": 1, "alpha": 0.5, "value": t, "mode": "linear", "pads": [1, 0]}},
        {"subgraphs": {"body": body}},
    ]
    prints = [fp(**c) for c in changes]
    assert base not in prints and len(set(prints)) == len(prints)
