"""``python -m migraphx_ep.driver <command> model.onnx|model.mxr [options]`` (MIGraphX's ``migraphx-driver``).

Commands: read (print the program), params (input names and shapes), compile (print the compiled
program; ``-o`` saves it), run (random inputs, output summary), perf (timing, per-instruction table),
verify (target vs ref on random inputs; ``--bisect`` finds the first differing instruction).
``--time`` prints the compile's seconds per stage, with NVRTC kernels compiled and cache hits.
Integer inputs that index a gather (token ids, embedding rows) are drawn inside what they index.
Exit status: 0 success, 1 failure (or a verify mismatch), 2 bad command line; every failure is one
``error: ...`` line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from .commands import COMMANDS, DriverError


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes are one ``error: ...`` line (exit 2), like every other driver error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {n}")
        return n

    return parse


def _tolerance(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not x >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be a non-negative number, got {text!r}")
    return x


def one_line(e: BaseException) -> str:
    """An exception as one line: its type (unless it is a DriverError) and message, lines joined."""
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    if isinstance(e, DriverError):
        return text or "failed"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m migraphx_ep.driver", description=__doc__.split("\n\n")[1])
    ap.add_argument("command", choices=sorted(COMMANDS))
    ap.add_argument("model", help="an .onnx model or an .mxr program file")
    tgt = ap.add_mutually_exclusive_group()
    tgt.add_argument("--ref", action="store_true", help="compile for the ref target")
    tgt.add_argument("--gpu", action="store_true", help="compile for the gpu target (default when available)")
    ap.add_argument("--fp16", action="store_true", help="quantize to fp16 before compiling")
    ap.add_argument(
        "--input-dim",
        action="append",
        default=[],
        metavar="NAME:D1,D2,...",
        help="dims of an input (repeatable)",
    )
    ap.add_argument(
        "--default-dim", type=_count(0), default=1, metavar="N", help="size of unknown dims (default 1)"
    )
    ap.add_argument("-o", "--output", help="save the program (.mxr) after read/compile")
    ap.add_argument("--format", choices=("msgpack", "json"), default="msgpack", help="format for -o")
    ap.add_argument("--iterations", type=_count(1), default=10, help="perf: runs to time (default 10)")
    ap.add_argument(
        "--top", type=_count(0), default=0, help="perf: rows of the instruction table (default all)"
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated inputs")
    ap.add_argument(
        "--rtol", type=_tolerance, default=None, help="verify: relative tolerance (1e-3; 2e-2 with --fp16)"
    )
    ap.add_argument(
        "--atol", type=_tolerance, default=None, help="verify: absolute tolerance (1e-5; 2e-2 with --fp16)"
    )
    ap.add_argument("--bisect", action="store_true", help="verify: find the first differing instruction")
    ap.add_argument("--exhaustive-tune", action="store_true", help="compile with exhaustive tuning")
    ap.add_argument("--disable-fast-math", action="store_true", help="compile without fast math")
    ap.add_argument(
        "--time",
        action="store_true",
        help="compile/run/perf: print where the compile's time went, stage by stage (load, parse, passes, "
        "lowering, nvrtc with kernels compiled and cache hits, library search, weights upload, graph "
        "capture...; stages that did not run are left out)",
    )
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rtol is None:
        args.rtol = 2e-2 if args.fp16 else 1e-3
    if args.atol is None:
        args.atol = 2e-2 if args.fp16 else 1e-5
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a driver failure is one line, never a traceback
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1


__all__ = ["build_parser", "main"]
