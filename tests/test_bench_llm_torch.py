"""bench/llm.py's torch systems (bench/llm_torch.py) without a GPU: the arguments, the row's precision,
and every way they cannot run (int4 row, no torch, no CUDA, no checkpoint) giving a JSON line, not a crash."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GENAI = REPO / "tests" / "models" / "genai"
HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def llm() -> types.ModuleType:
    sys.path.insert(0, str(REPO / "bench"))  # how the script finds its siblings
    try:
        import llm as module
    finally:
        sys.path.remove(str(REPO / "bench"))
    return module


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run(llm: types.ModuleType, model: str, systems: str, out: Path, *more: str) -> list[dict]:
    llm.main(["--model", str(GENAI / model), "--systems", systems, "--batch", "1,2", "--prompt", "4",
              "--new", "3", "--out", str(out), *more])  # fmt: skip
    return lines(out)


def fake_torch(monkeypatch: pytest.MonkeyPatch, cuda: bool) -> None:
    """torch where none is installed (or the real one), with torch.cuda.is_available() as given."""
    if HAS_TORCH:
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        return
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: cuda)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "transformers", types.ModuleType("transformers"))


def test_arguments_accept_the_torch_systems(llm: types.ModuleType) -> None:
    a = llm.parse_args(["--model", "m", "--systems", "ours_genai,torch_eager,torch_compile", "--hf", "h",
                        "--torch-warmup", "2"])  # fmt: skip
    assert a.systems.split(",") == ["ours_genai", "torch_eager", "torch_compile"]
    assert (a.hf, a.torch_warmup) == (Path("h"), 2)
    assert {"torch_eager", "torch_compile", "cuda_genai"} <= set(llm.SYSTEMS)
    defaults = llm.parse_args(["--model", "m"])
    assert (defaults.hf, defaults.torch_warmup) == (None, 3)


def test_arguments_refuse_an_unknown_system(llm: types.ModuleType, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        llm.parse_args(["--model", "m", "--systems", "ours_genai,torch_jit"])
    assert "torch_jit" in capsys.readouterr().err


def test_row_precision_and_checkpoint_folder() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import llm_torch
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert llm_torch.row_precision(GENAI / "llama_fp32") == "fp32"
    assert llm_torch.row_precision(GENAI / "llama_int4") == "int4"
    assert llm_torch.hf_folder(Path("/tmp/llm/fp16")) == Path("/tmp/llm/hf")
    assert llm_torch.hf_folder(Path("/tmp/llm/fp16"), Path("/x")) == Path("/x")


def test_int4_row_is_skipped_with_its_reason(llm: types.ModuleType, tmp_path: Path) -> None:
    recs = run(llm, "llama_int4", "torch_eager,torch_compile", tmp_path / "o.jsonl")
    assert [(r["system"], r["batch"]) for r in recs] == [
        ("torch_eager", 1), ("torch_compile", 1), ("torch_eager", 2), ("torch_compile", 2)
    ]  # fmt: skip
    for r in recs:
        assert "int4" in r["skipped"] and r["precision"] == "int4"
        assert "error" not in r and "ttft_ms" not in r


def test_torch_systems_give_error_lines_not_a_crash(llm: types.ModuleType, tmp_path: Path) -> None:
    """Whatever this machine lacks (torch, CUDA, the checkpoint), each torch row is an error line."""
    recs = run(llm, "llama_fp32", "torch_eager,torch_compile", tmp_path / "o.jsonl")
    assert len(recs) == 4
    for r in recs:
        assert r["error"] and "ttft_ms" not in r and "tokens_head" not in r


def test_no_cuda_is_an_unavailable_line(
    llm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_torch(monkeypatch, cuda=False)
    recs = run(llm, "llama_fp32", "torch_compile,torch_eager", tmp_path / "o.jsonl")
    assert len(recs) == 4
    for r in recs:
        assert r["unavailable"] is True and "CUDA" in r["error"]


def test_missing_checkpoint_is_an_error_line(
    llm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_torch(monkeypatch, cuda=True)
    recs = run(llm, "llama_fp32", "torch_compile", tmp_path / "o.jsonl", "--hf", str(tmp_path / "nothing"))
    assert len(recs) == 2
    for r in recs:
        assert r["error"].startswith("FileNotFoundError") and "--hf" in r["error"]


@pytest.mark.skipif(HAS_TORCH, reason="torch is installed here")
def test_no_torch_is_an_unavailable_line(llm: types.ModuleType, tmp_path: Path) -> None:
    recs = run(llm, "llama_fp32", "torch_eager", tmp_path / "o.jsonl")
    assert all(r["unavailable"] is True and "torch" in r["error"] for r in recs)
