"""The compile-time recorder (``migraphx_ep.timing``): own seconds per stage on a fake clock, counts,
per-thread records, pool threads, nesting, and the table and one-line summary."""

from __future__ import annotations

import threading
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from migraphx_ep import timing
from migraphx_ep.timing import CompileTimes, carry, count, current, record, stage


@pytest.fixture
def clock(monkeypatch):
    """A clock that moves only when the test says: ``clock(2.0)`` lets two seconds pass."""
    now = [0.0]
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def tick(seconds: float) -> None:
        now[0] += seconds

    return tick


def test_without_a_record_stages_and_counts_do_nothing():
    assert current() is None
    assert stage("parse") is stage("passes")  # one shared do-nothing context: no clock, no allocation
    with stage("parse"):
        count("nvrtc", "compiled")
    assert current() is None


def test_stages_hold_their_own_seconds(clock):
    with record() as t:
        assert current() is t
        with stage("parse"):
            clock(1.0)
            with stage("passes"):
                clock(2.0)
            with stage("parse"):  # the same name nested (a subgraph's parse) adds once
                clock(4.0)
            clock(1.0)
        clock(0.5)  # under no stage: "other"
    assert current() is None
    assert t.stages == {"parse": 6.0, "passes": 2.0}
    assert t.total == 8.5 and t.other() == 0.5
    assert [(n, s) for n, s, _ in t.rows()] == [("parse", 6.0), ("passes", 2.0), ("other", 0.5)]


def test_a_failing_stage_still_counts_and_unwinds(clock):
    with record() as t:
        with pytest.raises(ValueError), stage("lowering"):
            clock(3.0)
            raise ValueError("refused")
        with stage("nvrtc"):
            clock(1.0)
    assert t.stages == {"lowering": 3.0, "nvrtc": 1.0} and t.other() == 0.0


def test_counts_join_their_stage():
    with record() as t:
        count("nvrtc", "compiled", 3)
        count("nvrtc", "cache hits")
        count("nvrtc", "compiled")
    assert t.counts == {"nvrtc": {"compiled": 4, "cache hits": 1}}
    assert t.rows()[0] == ("nvrtc", 0.0, {"compiled": 4, "cache hits": 1})


def test_records_on_two_threads_do_not_mix():
    both = threading.Barrier(2)
    got: dict[str, CompileTimes] = {}

    def compile_one(name: str) -> None:
        with record() as t:
            both.wait()  # both records are open at once
            with stage(name):
                count(name, "kernels")
            both.wait()
        got[name] = t

    threads = [threading.Thread(target=compile_one, args=(n,)) for n in ("a", "b")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert list(got["a"].stages) == ["a"] and got["a"].counts == {"a": {"kernels": 1}}
    assert list(got["b"].stages) == ["b"] and got["b"].counts == {"b": {"kernels": 1}}


def test_pool_threads_count_into_the_callers_record_through_carry(clock):
    def work(i: int) -> int:
        with stage("inside the pool"):  # the caller's stage holds the pool's time: nothing added
            clock(100.0)
        count("nvrtc", "compiled")
        return i

    with record() as t:
        with stage("nvrtc"), ThreadPoolExecutor(4) as ex:
            assert list(ex.map(carry(work), range(8))) == list(range(8))
        with ThreadPoolExecutor(2) as ex:
            list(ex.map(work, range(3)))  # not carried: the pool's own threads record nothing
    assert t.counts == {"nvrtc": {"compiled": 8}}
    assert list(t.stages) == ["nvrtc"] and t.stages["nvrtc"] == 800.0  # the fake clock is shared
    assert carry(work) is work  # nothing to carry outside a record


def test_a_record_inside_another_adds_to_it(clock):
    with record() as outer:
        with stage("compile"):
            clock(1.0)
            with record() as inner:
                with stage("passes"):
                    clock(2.0)
                count("nvrtc", "compiled")
                clock(0.25)  # the inner record's "other" stays the outer stage's own time
    assert inner.stages == {"passes": 2.0, "nvrtc": 0.0} and inner.total == 2.25
    assert outer.stages == {"compile": 1.25, "passes": 2.0, "nvrtc": 0.0} and outer.total == 3.25
    assert outer.counts == {"nvrtc": {"compiled": 1}}


def test_a_record_continued_with_into(clock):
    t = CompileTimes()
    with record(into=t):
        with stage("load"):
            clock(1.0)
    clock(50.0)  # between the two blocks: not part of the record
    with record(into=t):
        with stage("passes"):
            clock(2.0)
        with record(into=t):  # the same record nested: counted once
            clock(1.0)
    assert t.stages == {"load": 1.0, "passes": 2.0} and t.total == 4.0 and t.other() == 1.0


def test_table_and_summary(clock):
    with record() as t:
        with stage("passes"):
            clock(1.0)
        with stage("nvrtc"):
            clock(3.0)
            count("nvrtc", "compiled", 2)
            count("nvrtc", "cache hits")
        with stage("graph capture"):
            pass  # ran, took no time: still listed
    lines = t.table().splitlines()
    assert lines[0].split() == ["stage", "seconds", "share", "counts"]
    assert lines[1].split() == ["passes", "1.000", "25.0%"]
    assert lines[2].split() == ["nvrtc", "3.000", "75.0%", "2", "compiled,", "1", "cache", "hits"]
    assert lines[3].split() == ["graph", "capture", "0.000", "0.0%"]
    assert lines[4].split() == ["other", "0.000", "0.0%"]
    assert lines[5].split() == ["total", "4.000", "100.0%"]
    want = "4.000 s: nvrtc 3.000 s (2 compiled, 1 cache hits), passes 1.000 s, graph capture 0.000 s"
    assert t.summary() == want  # "other" only when it shows
    assert CompileTimes().summary() == "0.000 s"
