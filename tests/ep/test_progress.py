"""Progress warnings for a long compile a Run waits for (ep/progress.py, MIGRAPHX_EP_PROGRESS_S)."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from test_batch_rows import ROWWISE, one_node_graph

from migraphx_ep import timing
from migraphx_ep.ep.provider import create_ep


def _slow_subgraph(seconds: float):  # noqa: ANN202
    """A one-node subgraph whose compile spends ``seconds`` in a stage named 'slow step'."""
    nodes, inits = ROWWISE["gemm with bias"]
    c = create_ep({"migraphx_target": "ref"}).compile(one_node_graph(nodes, None, inits), "fused_0")
    real = c._compile_program

    def slow(prog, options, values):  # noqa: ANN001, ANN202
        with timing.stage("slow step"):
            time.sleep(seconds)
        real(prog, options, values)

    c._compile_program = slow
    return c


def _reports(caplog) -> list[str]:  # noqa: ANN001
    return [r.getMessage() for r in caplog.records if "still compiling" in r.getMessage()]


def test_a_long_compile_reports_its_stage(monkeypatch, caplog) -> None:  # noqa: ANN001
    monkeypatch.setenv("MIGRAPHX_EP_PROGRESS_S", "0.1")
    c = _slow_subgraph(0.45)
    with caplog.at_level(logging.WARNING, logger="migraphx_ep"):
        c.run([np.ones((3, 6), np.float32)])
    got = _reports(caplog)
    assert 2 <= len(got) <= 5, got
    assert all("fused_0" in m and "x[3, 6]" in m and "now slow step" in m for m in got), got
    assert all(r.levelno == logging.WARNING for r in caplog.records if "still compiling" in r.getMessage())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="migraphx_ep"):
        time.sleep(0.3)  # the watcher ended with the compile: nothing after it
    assert not _reports(caplog)


@pytest.mark.parametrize("value", ["0", "-1", "30"])
def test_no_report_when_off_or_the_compile_is_shorter(monkeypatch, caplog, value) -> None:  # noqa: ANN001
    monkeypatch.setenv("MIGRAPHX_EP_PROGRESS_S", value)
    c = _slow_subgraph(0.3)
    with caplog.at_level(logging.WARNING, logger="migraphx_ep"):
        c.run([np.ones((3, 6), np.float32)])
    assert not _reports(caplog)


@pytest.mark.parametrize("value", ["soon", "nan", "inf"])
def test_a_bad_interval_is_an_error_naming_the_variable(monkeypatch, value) -> None:  # noqa: ANN001
    monkeypatch.setenv("MIGRAPHX_EP_PROGRESS_S", value)
    c = _slow_subgraph(0.0)
    with pytest.raises(ValueError, match="MIGRAPHX_EP_PROGRESS_S"):
        c.run([np.ones((3, 6), np.float32)])


def test_stages_running_now_are_tracked() -> None:
    with timing.record() as times:
        assert times.now() == ""
        with timing.stage("outer"):
            with timing.stage("inner"):
                assert times.running == ["outer", "inner"] and times.now() == "inner"
            assert times.now() == "outer"
    assert times.now() == "" and times.running == []
