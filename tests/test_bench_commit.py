"""The benchmark report names the commit that was measured: run.py records the git tree of the files as
they are, report.py finds the commit with that tree (the GPU machine's copy has a stale .git HEAD)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import report  # noqa: E402
import run  # noqa: E402


def git(*args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True)
        return out.stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")


def test_recorded_tree_names_the_commit_not_the_stale_head() -> None:
    head, tree = git("rev-parse", "HEAD", "HEAD^{tree}").split()
    stale = {"git_commit": "0" * 40, "git_dirty": True, "git_tree": tree}
    assert report.commit_values([stale], None) == [head]


def test_unknown_tree_falls_back_to_the_head_and_says_it_was_dirty() -> None:
    env = {"git_commit": "abc", "git_dirty": True, "git_tree": "f" * 40}
    assert report.commit_values([env], None) == ["abc (with uncommitted changes)"]
    assert report.commit_values([env], "c0ffee")[0].startswith("c0ffee (given to report.py")


def test_worktree_tree_is_a_tree_id() -> None:
    git("rev-parse", "HEAD")
    tree = run.worktree_tree()
    assert tree is not None and git("cat-file", "-t", tree).strip() == "tree"
    if not git("status", "--porcelain"):
        assert tree == git("rev-parse", "HEAD^{tree}").strip()  # a clean checkout: HEAD's own tree
