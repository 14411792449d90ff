"""``python -m migraphx_ep.driver <command> model.onnx|model.mxr [options]`` (MIGraphX's ``migraphx-driver``).

Commands: read (print the program), params (input names and shapes), compile (print the compiled
program; ``-o`` saves it), run (random inputs, output summary), perf (timing, per-instruction table),
verify (target vs ref on random inputs; ``--bisect`` finds the first differing instruction).
Exit status: 0 success, 1 failure (or a verify mismatch), 2 bad command line.
"""

from __future__ import annotations

import argparse
import sys

from .commands import COMMANDS, DriverError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m migraphx_ep.driver", description=__doc__.split("\n\n")[1])
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
        "--default-dim", type=int, default=1, metavar="N", help="size of unknown dims (default 1)"
    )
    ap.add_argument("-o", "--output", help="save the program (.mxr) after read/compile")
    ap.add_argument("--format", choices=("msgpack", "json"), default="msgpack", help="format for -o")
    ap.add_argument("--iterations", type=int, default=10, help="perf: runs to time (default 10)")
    ap.add_argument("--top", type=int, default=0, help="perf: rows of the instruction table (default all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated inputs")
    ap.add_argument(
        "--rtol", type=float, default=None, help="verify: relative tolerance (1e-3; 2e-2 with --fp16)"
    )
    ap.add_argument(
        "--atol", type=float, default=None, help="verify: absolute tolerance (1e-5; 2e-2 with --fp16)"
    )
    ap.add_argument("--bisect", action="store_true", help="verify: find the first differing instruction")
    ap.add_argument("--exhaustive-tune", action="store_true", help="compile with exhaustive tuning")
    ap.add_argument("--disable-fast-math", action="store_true", help="compile without fast math")
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
    except DriverError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError, TypeError, OSError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


__all__ = ["build_parser", "main"]
