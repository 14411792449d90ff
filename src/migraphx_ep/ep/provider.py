"""The EP's Python side: options, GetCapability (partitioning) and Compile (the bridge's backend)."""

from __future__ import annotations

import collections
import logging
import sys
from typing import Any

from ..ir.program import Program
from ..quantize import quantize_bf16, quantize_fp16
from ..targets import TargetError, get_target
from .cache import ProgramStore
from .compiled import CompiledSubgraph
from .options import EpOptions, parse_options
from .partition import partition

log = logging.getLogger("migraphx_ep")

EP_NAME = "MIGraphXExecutionProvider"


def resolve_target(options: EpOptions) -> str:
    """``auto`` means gpu where a usable one exists, else ref (with a notice)."""
    if options.target == "ref":
        return "ref"
    try:
        get_target("gpu")
        return "gpu"
    except TargetError as e:
        if options.target == "gpu":
            raise TargetError(f"migraphx_target=gpu was requested but {e}") from None
        log.info("%s: no usable GPU target (%s); compiling for the ref target", EP_NAME, e)
        return "ref"


class MIGraphXEp:
    def __init__(self, options: dict[str, str]) -> None:
        self.options = parse_options(options)
        self.target_name = resolve_target(self.options)
        self.compiled: list[CompiledSubgraph] = []
        self.store = ProgramStore(self.options)
        self.last_partition: dict[str, Any] = {}

    # -- GetCapability --------------------------------------------------------------------------
    def get_capability(self, graph: dict) -> list[list[int]]:
        part = partition(graph)
        self.last_partition = {"groups": part.groups, "refused": part.refused}
        nodes = {n["index"]: n for n in graph["nodes"]}
        if self.options.dump_model_ops:
            self._dump(graph, part.groups, part.refused)
        if part.refused:
            counts = collections.Counter(nodes[i]["op_type"] for i in part.refused)
            claimed = sum(len(g) for g in part.groups)
            log.warning(
                "%s: claimed %d of %d nodes in %d partition(s); %d left to other providers: %s",
                EP_NAME,
                claimed,
                len(nodes),
                len(part.groups),
                len(part.refused),
                ", ".join(f"{op} x{n}" for op, n in counts.most_common()),
            )
        return part.groups

    def _dump(self, graph: dict, groups: list[list[int]], refused: dict[int, str]) -> None:
        group_of = {i: g for g, members in enumerate(groups) for i in members}
        print(f"[{EP_NAME}] graph {graph.get('name', '')!r}: {len(graph['nodes'])} nodes", file=sys.stdout)
        for n in graph["nodes"]:
            label = f"{n['domain'] + '::' if n['domain'] else ''}{n['op_type']} ({n['name']})"
            if n["index"] in group_of:
                print(f"[{EP_NAME}]   claimed  partition {group_of[n['index']]}: {label}", file=sys.stdout)
            else:
                print(
                    f"[{EP_NAME}]   refused  {label}: {refused.get(n['index'], 'unknown')}", file=sys.stdout
                )
        sys.stdout.flush()

    # -- Compile --------------------------------------------------------------------------------
    def compile_program(self, prog: Program, options: EpOptions) -> None:
        if options.fp16_enable:
            quantize_fp16(prog)
        elif options.bf16_enable:
            quantize_bf16(prog)
        prog.compile(get_target(self.target_name), exhaustive_tune=options.exhaustive_tune)

    def compile(self, graph: dict, fused_node_name: str) -> CompiledSubgraph:
        c = CompiledSubgraph(
            graph, fused_node_name, self.options, self.compile_program, self.store, self.target_name
        )
        self.compiled.append(c)
        return c


def create_ep(options: dict[str, str]) -> MIGraphXEp:
    return MIGraphXEp(options)
