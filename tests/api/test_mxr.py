"""The .mxr program file: exact round trips, metadata, compiled programs, and clear errors on bad files."""

from __future__ import annotations

import json
import mmap
import os

import ml_dtypes
import msgpack
import numpy as np
import pytest

from migraphx_ep import (
    mxr,
    ops,  # noqa: F401 - fills the op table
)
from migraphx_ep.ir import DType, Program, Shape, make_op
from migraphx_ep.mxr import MxrError
from migraphx_ep.targets import get_target

RNG = np.random.default_rng(7)


def sample_program() -> Program:
    """Params, literals of many types (0-d, empty, bf16, fp8, bool), views, a convert, and an ``if``."""
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", Shape(DType.float_type, [2, 3]))
    cond = m.add_parameter("cond", Shape(DType.bool_type, [1]))
    w = m.add_literal(RNG.standard_normal((2, 3)).astype(np.float32))
    m.add_literal(np.asarray(3.5, dtype=np.float64))
    m.add_literal(np.zeros((0, 4), dtype=np.int64))
    m.add_literal(RNG.standard_normal(5).astype(ml_dtypes.bfloat16))
    m.add_literal(RNG.standard_normal(4).astype(ml_dtypes.float8_e4m3fn))
    m.add_literal(np.array([True, False, True]))
    b = m.add_literal(RNG.standard_normal((1, 3)).astype(np.float32))
    bb = m.add_instruction(make_op("multibroadcast", out_lens=[2, 3]), [b])
    a = m.add_instruction(make_op("add"), [x, w])
    c = m.add_instruction(make_op("mul"), [a, bb])
    then_m, else_m = p.create_module("then"), p.create_module("else")
    t0 = then_m.add_parameter("t0", Shape(DType.float_type, [2, 3]))
    then_m.add_return([then_m.add_instruction(make_op("neg"), [t0])])
    e0 = else_m.add_parameter("e0", Shape(DType.float_type, [2, 3]))
    else_m.add_return([else_m.add_instruction(make_op("exp"), [e0])])
    f = m.add_instruction(make_op("if"), [cond, c, c], [then_m, else_m])
    g = m.add_instruction(make_op("get_tuple_elem", index=0), [f])
    h = m.add_instruction(make_op("convert", target_type=DType.half_type), [g])
    m.add_return([g, h, c])
    return p


INPUTS = {"x": RNG.standard_normal((2, 3)).astype(np.float32), "cond": np.array([False])}


def assert_same_results(p: Program, q: Program) -> None:
    for cond in (False, True):
        inputs = {**INPUTS, "cond": np.array([cond])}
        for u, v in zip(p.run_numpy(inputs), q.run_numpy(inputs), strict=True):
            assert u.dtype == v.dtype and u.shape == v.shape
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_round_trip_exact(tmp_path, fmt):
    p = sample_program()
    path = tmp_path / f"p.{fmt}.mxr"
    mxr.save(p, path, format=fmt, metadata={"hash": "abc123", "options": {"fp16": True, "n": 3}})
    q = mxr.load(path, format=fmt)
    assert q == p
    assert str(q) == str(p)  # same instruction order and printing, module by module
    assert list(q.modules) == list(p.modules)
    assert not q.is_compiled()
    assert_same_results(p, q)
    assert mxr.read_metadata(path) == {"hash": "abc123", "options": {"fp16": True, "n": 3}}
    # Literal bytes survive exactly, including bf16/fp8 bit patterns.
    for a, b in zip(p.get_main_module().instructions, q.get_main_module().instructions, strict=True):
        if a.is_literal():
            assert a.op.value.dtype == b.op.value.dtype
            assert a.op.value.tobytes() == b.op.value.tobytes()


def test_saved_file_is_stable_and_atomic(tmp_path):
    p = sample_program()
    path = tmp_path / "p.mxr"
    mxr.save(p, path)
    first = path.read_bytes()
    mxr.save(mxr.load(path), path)
    assert path.read_bytes() == first  # load + save reproduces the file byte for byte
    assert sorted(os.listdir(tmp_path)) == ["p.mxr"]  # no temporary files left behind
    with pytest.raises(MxrError, match="metadata"):
        mxr.save(p, path, metadata={1: "not a string key"})
    with pytest.raises(MxrError, match="json"):
        mxr.save(p, tmp_path / "q.mxr", format="json", metadata={"blob": b"bytes are msgpack-only"})
    assert path.read_bytes() == first and sorted(os.listdir(tmp_path)) == ["p.mxr"]


def test_compiled_program_and_blob(tmp_path):
    p = sample_program()
    p.compile(get_target("ref"))
    path = tmp_path / "c.mxr"
    mxr.save(p, path, metadata={"k": 1}, compiled=b"\x00kernels\xff")
    f = mxr.load_file(path)
    assert f.program.is_compiled() and f.program.target_name == "ref" and f.target == "ref"
    assert f.compiled == b"\x00kernels\xff"
    assert f.program == p
    assert_same_results(p, f.program)
    assert mxr.read_header(path)["target"] == "ref"
    mxr.save(p, path)  # no blob: still restores a runnable ref program
    assert mxr.load_file(path).compiled is None


def test_large_weight_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(mxr, "_CHUNK", 7)  # force several bin chunks per weight
    p = sample_program()
    path = tmp_path / "p.mxr"
    mxr.save(p, path)
    q = mxr.load(path)
    assert q == p
    assert_same_results(p, q)


def test_read_metadata_skips_weights(tmp_path):
    path = tmp_path / "p.mxr"
    mxr.save(sample_program(), path, metadata={"m": [1, 2]})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # cut inside the weights
    assert mxr.read_metadata(path) == {"m": [1, 2]}
    with pytest.raises(MxrError, match="truncated"):
        mxr.load(path)


def bad_loads(path) -> None:
    with pytest.raises(MxrError) as e:
        mxr.load(path)
    assert str(path) in str(e.value)


def test_every_truncation_is_a_clear_error(tmp_path):
    src = tmp_path / "p.mxr"
    mxr.save(sample_program(), src)
    data = src.read_bytes()
    cut = tmp_path / "cut.mxr"
    for n in range(0, len(data), 5):
        cut.write_bytes(data[:n])
        bad_loads(cut)
    jsrc = tmp_path / "p.json"
    mxr.save(sample_program(), jsrc, format="json")
    jdata = jsrc.read_bytes()
    for n in (1, 50, len(jdata) // 2, len(jdata) - 1):
        cut.write_bytes(jdata[:n])
        bad_loads(cut)


def test_every_byte_flip_errors_or_is_harmless(tmp_path):
    p = sample_program()
    src = tmp_path / "p.mxr"
    mxr.save(p, src)
    data = src.read_bytes()
    bad = tmp_path / "bad.mxr"
    harmless = 0
    for i in range(0, len(data), 3):
        flipped = bytearray(data)
        flipped[i] ^= 0x5A
        bad.write_bytes(bytes(flipped))
        try:
            q = mxr.load(bad)
        except MxrError:
            continue
        assert q == p  # e.g. a flipped character of the producer version string
        harmless += 1
    assert harmless < len(data) // 30


def test_a_flipped_byte_in_a_large_weight_names_that_weight(tmp_path):
    """Weights over 1 MiB are checksummed on a thread pool; the error still names the first bad one."""
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", Shape(DType.float_type, [3, 1 << 17]))
    big = [RNG.standard_normal((1, 1 << 17)).astype(np.float32) for _ in range(3)]  # 512 KiB each...
    big[1] = np.tile(big[1], (3, 1))  # ...but this one is 1.5 MiB
    m.add_literal(np.float32(2.0))
    for w in big:
        x = m.add_instruction(
            make_op("add"),
            [x, m.add_instruction(make_op("multibroadcast", out_lens=[3, 1 << 17]), [m.add_literal(w)])],
        )
    m.add_return([x])
    src = tmp_path / "p.mxr"
    mxr.save(p, src)
    assert mxr.load(src) == p
    data = bytearray(src.read_bytes())
    at = bytes(data).find(big[1].tobytes()[:64])
    for k, i in enumerate((at + 1000, bytes(data).find(big[2].tobytes()[:64]) + 7)):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        (tmp_path / "bad.mxr").write_bytes(bytes(bad))
        with pytest.raises(MxrError, match=r"weight \d+ fails its checksum") as e:
            mxr.load(tmp_path / "bad.mxr")
        assert str(e.value).count("weight") == 1
        if k == 0:
            first = str(e.value)
    assert first != str(e.value)  # the two flips name different weights


def test_foreign_files(tmp_path):
    f = tmp_path / "x.mxr"
    for content, why in [
        (b"", "empty"),
        (b"\x08\x07\x12\x04onnx-protobuf-bytes", "not a migraphx_ep"),
        (b"\x89MX", "truncated"),
        (b'{"a": 1}', "not a migraphx_ep"),
        (b"\x89MXR-EP\n\x01\x02", "not a binary section"),
    ]:
        f.write_bytes(content)
        with pytest.raises(MxrError, match=why):
            mxr.load(f)
    with pytest.raises(MxrError, match="cannot open"):
        mxr.load(tmp_path / "missing.mxr")
    with pytest.raises(MxrError, match="unknown format"):
        mxr.load(f, format="yaml")


def _rewrite_header(data: bytes, change: dict) -> bytes:
    n0 = len(mxr.MAGIC)
    size = data[n0 + 1]  # bin8: the header is small
    header = msgpack.unpackb(data[n0 + 2 : n0 + 2 + size])
    header.update(change)
    hb = msgpack.packb(header)
    return data[:n0] + b"\xc4" + bytes([len(hb)]) + hb + data[n0 + 2 + size :]


def test_wrong_version_and_producer(tmp_path):
    src = tmp_path / "p.mxr"
    mxr.save(sample_program(), src)
    data = src.read_bytes()
    assert data[len(mxr.MAGIC)] == 0xC4
    bad = tmp_path / "v.mxr"
    bad.write_bytes(_rewrite_header(data, {"format_version": 3}))
    with pytest.raises(MxrError, match="format version 3"):
        mxr.load(bad)
    with pytest.raises(MxrError, match="format version 3"):
        mxr.read_metadata(bad)
    bad.write_bytes(_rewrite_header(data, {"producer": "someone-else"}))
    with pytest.raises(MxrError, match="not a migraphx_ep"):
        mxr.load(bad)
    bad.write_bytes(_rewrite_header(data, {"target": "tpu"}))
    with pytest.raises(MxrError, match="tpu"):
        mxr.load(bad)
    jpath = tmp_path / "p.json"
    mxr.save(sample_program(), jpath, format="json")
    doc = json.loads(jpath.read_text())
    doc["format_version"] = 99
    jpath.write_text(json.dumps(doc))
    with pytest.raises(MxrError, match="format version 99"):
        mxr.load(jpath, format="json")


def _edit_json(tmp_path, edit) -> os.PathLike:
    path = tmp_path / "p.json"
    mxr.save(sample_program(), path, format="json")
    doc = json.loads(path.read_text())
    edit(doc["program"]["modules"])
    path.write_text(json.dumps(doc))
    return path


def test_inconsistent_program_records(tmp_path):
    def unknown_op(mods):
        mods[0]["instructions"][-2]["op"] = "frobnicate"

    def forward_ref(mods):
        mods[0]["instructions"][10]["inputs"] = [11, 0]

    def wrong_shape(mods):
        mods[0]["instructions"][-2]["shape"]["lens"] = [9, 9]
        mods[0]["instructions"][-2]["shape"]["strides"] = [9, 1]

    def bad_attr(mods):
        mods[0]["instructions"][-2]["attrs"] = {"target_type": 2, "bogus": 1}

    def missing_module(mods):
        del mods[1]

    for edit, why in [
        (unknown_op, "unknown operator"),
        (forward_ref, "does not precede"),
        (wrong_shape, "computes"),
        (bad_attr, "bogus"),
        (missing_module, "unknown module"),
    ]:
        with pytest.raises(MxrError, match=why):
            mxr.load(_edit_json(tmp_path, edit))


def test_detects_format_from_content(tmp_path):
    p = sample_program()
    mxr.save(p, tmp_path / "a", format="json")
    mxr.save(p, tmp_path / "b", format="msgpack")
    assert mxr.load(tmp_path / "a", format="msgpack") == p
    assert mxr.load(tmp_path / "b", format=None) == p


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_empty_weight_last(tmp_path, fmt):
    p = Program()
    m = p.get_main_module()
    m.add_return([m.add_literal(np.zeros((0, 2), np.float32)), m.add_literal(np.zeros((2, 0), np.int8))])
    mxr.save(p, tmp_path / "e.mxr", format=fmt)
    q = mxr.load(tmp_path / "e.mxr")
    assert q == p and [a.shape for a in q.run_numpy({})] == [(0, 2), (2, 0)]


def test_equal_records_decode_to_one_shared_op(tmp_path):
    """A transformer's layers repeat their records: the decoder makes each distinct op once (ops are
    immutable) and the program still loads equal to the one saved, with each instruction's shape checked."""
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", Shape(DType.float_type, [2, 8]))
    for _ in range(4):
        w = m.add_literal(RNG.standard_normal((2, 8)).astype(np.float32))
        x = m.add_instruction(make_op("relu"), [m.add_instruction(make_op("add"), [x, w])])
        for _ in range(2):  # [8, 2], then [2, 8] again
            x = m.add_instruction(make_op("transpose", permutation=[1, 0]), [x])
    m.add_return([x])
    src = tmp_path / "p.mxr"
    mxr.save(p, src)
    q = mxr.load(src)
    assert q == p
    ins = q.get_main_module().instructions
    adds = [i.op for i in ins if i.name == "add"]
    transposes = [i.op for i in ins if i.name == "transpose"]
    assert all(a is adds[0] for a in adds) and all(t is transposes[0] for t in transposes)
    assert len(adds) == 4 and len(transposes) == 8
    assert [list(i.shape.lens) for i in ins if i.name == "transpose"] == [[8, 2], [2, 8]] * 4
    assert len({id(i.op) for i in ins if i.is_literal()}) == 4  # weights are never shared


def _big_weights_program() -> Program:
    """Three weights over 1 MiB (checksummed on the pool) and a small one."""
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", Shape(DType.float_type, [2, 1 << 18]))
    m.add_literal(np.float32(2.0))
    for _ in range(3):
        w = m.add_literal(RNG.standard_normal((2, 1 << 18)).astype(np.float32))  # 2 MiB
        x = m.add_instruction(make_op("add"), [x, w])
    m.add_return([x])
    return p


def _mapped(a: object) -> bool:
    """Whether ``a`` views a mapped file (through array bases and memoryviews)."""
    while a is not None and not isinstance(a, mmap.mmap):
        a = a.obj if isinstance(a, memoryview) else getattr(a, "base", None)
    return isinstance(a, mmap.mmap)


def _weights(p: Program) -> list[np.ndarray]:
    return [i.op.value for m in p.modules.values() for i in m.instructions if i.is_literal()]


def test_weights_start_aligned_and_load_as_views_of_the_mapped_file(tmp_path, monkeypatch):
    p = _big_weights_program()
    src = tmp_path / "p.mxr"
    mxr.save(p, src)
    data = src.read_bytes()
    for w in _weights(p):
        at = data.find(w.tobytes())
        assert at > 0 and at % 64 == 0, at
    q = mxr.load(src)
    assert q == p
    loaded = _weights(q)
    assert all(_mapped(w) and not w.flags.writeable for w in loaded)
    x = {"x": RNG.standard_normal((2, 1 << 18)).astype(np.float32)}
    np.testing.assert_array_equal(q.run_numpy(x)[0], p.run_numpy(x)[0])
    monkeypatch.setenv("MIGRAPHX_EP_MXR_MAP", "0")  # read into buffers of their own, as before
    r = mxr.load(src)
    assert r == p and not any(_mapped(w) for w in _weights(r))


def test_version_1_files_without_padding_still_load(tmp_path, monkeypatch):
    p = sample_program()
    monkeypatch.setattr(mxr, "FORMAT_VERSION", 1)
    monkeypatch.setattr(mxr, "_ALIGN", 1)  # what version 1 wrote: no padding
    src = tmp_path / "v1.mxr"
    mxr.save(p, src)
    monkeypatch.undo()
    assert mxr.read_header(src)["format_version"] == 1
    q = mxr.load(src)
    assert q == p
    assert_same_results(p, q)


def test_padding_longer_than_an_alignment_is_a_clear_error(tmp_path):
    p = _big_weights_program()
    src = tmp_path / "p.mxr"
    mxr.save(p, src)
    data = src.read_bytes()
    w = max(_weights(p), key=lambda a: a.nbytes)
    at = data.find(w.tobytes()) - 5  # its bin32 header
    bad = tmp_path / "bad.mxr"
    bad.write_bytes(data[:at] + b"\xc0" * 64 + data[at:])
    with pytest.raises(MxrError, match="padding"):
        mxr.load(bad)


def test_a_bad_map_switch_is_an_error_naming_it(tmp_path, monkeypatch):
    src = tmp_path / "p.mxr"
    mxr.save(_big_weights_program(), src)
    monkeypatch.setenv("MIGRAPHX_EP_MXR_MAP", "sometimes")
    with pytest.raises(ValueError, match="MIGRAPHX_EP_MXR_MAP"):
        mxr.load(src)
