"""ep/gc_pause.py: the cyclic garbage collector is off while a program compiles, back on (and the
compile's cycles freed) when the last running compile ends; a collector the process turned off stays
off, and MIGRAPHX_EP_PAUSE_GC=0 leaves it alone."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from migraphx_ep.ep.gc_pause import gc_paused
from migraphx_ep.ep.provider import create_ep
from migraphx_ep.frontend import model_to_dict


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_off_inside_on_after_and_the_cycles_are_freed() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        ref = weakref.ref(Node())
        assert ref() is not None  # nothing collects it meanwhile
    assert gc.isenabled()
    assert ref() is None  # the young collection at the end freed it


def test_concurrent_compiles_keep_it_off_until_the_last_one_ends() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            release.wait(5)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(5)
    with gc_paused():
        pass
    assert not gc.isenabled()  # the other compile still runs
    release.set()
    t.join(5)
    assert gc.isenabled()


def test_a_collector_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_PAUSE_GC", "0")
    with gc_paused():
        assert gc.isenabled()
    monkeypatch.setenv("MIGRAPHX_EP_PAUSE_GC", "off")
    with pytest.raises(ValueError, match="MIGRAPHX_EP_PAUSE_GC='off': expected one of"), gc_paused():
        pass
    assert gc.isenabled()


def test_a_compile_through_the_ep_runs_with_the_collector_off() -> None:
    g = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])], "g",
        [h.make_tensor_value_info("x", T.FLOAT, ["B", 4])], [h.make_tensor_value_info("y", T.FLOAT, None)],
    )  # fmt: skip
    c = create_ep({"migraphx_target": "ref"}).compile(
        model_to_dict(h.make_model(g, opset_imports=[h.make_opsetid("", 17)])), "fused_0"
    )
    real, seen = c._compile_program, []

    def spy(prog, options, values):  # noqa: ANN001, ANN202
        seen.append(gc.isenabled())
        real(prog, options, values)

    c._compile_program = spy
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    np.testing.assert_array_equal(c.run([x])[0], np.maximum(x, 0))
    assert seen == [False] and gc.isenabled()
