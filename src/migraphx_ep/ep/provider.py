"""The EP's Python side: options, GetCapability (partitioning) and Compile (the bridge's backend)."""

from __future__ import annotations

import collections
import functools
import logging
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..ir.dtypes import DType
from ..ir.instruction import Instruction
from ..ir.program import Program
from ..quantize import quantize_bf16, quantize_fp16
from ..switches import env_choice, env_int
from ..targets import TargetError, get_target
from ..timing import stage
from .cache import ProgramStore
from .calibration import load_table, quantize_with_table
from .compat import session_info, validate
from .compiled import CompiledSubgraph
from .epcontext import context_node, is_context_node, is_our_context, load_context
from .options import EpOptions, OptionError, parse_options
from .partition import Partition, graph_signature, partition
from .subgraphs import expand_fused, is_ours, with_outer_scope_inputs

log = logging.getLogger("migraphx_ep")

EP_NAME = "MIGraphXExecutionProvider"


def resolve_target(options: EpOptions) -> str:
    """``ref`` when asked for; ``gpu`` where a usable one exists; else ``auto`` falls back to ref with a
    warning. Asking for the GPU without one is an error naming what asked: ``migraphx_target=gpu``, or a
    ``device_id`` the user set (through any route, even ``0``), never a silent run on the CPU."""
    if options.target == "ref":
        return "ref"  # the user chose the CPU oracle; a device_id does not apply to it
    from ..targets.gpu import gpu_available

    reason = gpu_available(options.device_id)
    if reason is None:
        return "gpu"
    if options.target == "gpu":
        raise TargetError(
            f"{EP_NAME}: migraphx_target=gpu (or ORT_MIGRAPHX_TARGET=gpu) was set but the gpu target "
            f"cannot run with device_id={options.device_id}: {reason}"
        )
    if "device_id" in options.given:
        raise TargetError(
            f"{EP_NAME}: device_id={options.device_id} was set but the gpu target cannot run: {reason}. "
            "Leave device_id unset to fall back to the ref target (CPU), or set migraphx_target=ref"
        )
    log.warning("%s: no usable GPU target (%s); compiling for the ref target (CPU)", EP_NAME, reason)
    return "ref"


def _gpu_capability(options: EpOptions) -> tuple[int, int]:
    """The GPU's compute capability (what it can run: fp8 needs 8.9); fp8 on an older one is an error."""
    from ..targets.gpu.quant import device_capability, fp8_option_reason

    if options.fp8_enable:
        reason = fp8_option_reason(options.device_id)
        if reason is not None:
            raise OptionError(f"{EP_NAME}: {reason}")
    return device_capability(options.device_id)


def _check_shell_switches() -> None:
    """The switches the C++ shell reads itself (csrc/host_staging.h, csrc/run_trace.h): checked here, where
    a bad value can fail the session with an error naming it, rather than be read as the default."""
    env_int("MIGRAPHX_EP_COPY_THREADS", 0, 0)
    env_choice("MIGRAPHX_EP_TRACE_RUN", "0", ("0", "1"))


class MIGraphXEp:
    def __init__(self, options: dict[str, str]) -> None:
        _check_shell_switches()
        self.options = parse_options(options)
        self.target_name = resolve_target(self.options)
        if self.target_name == "gpu":  # the device's context and the libraries, while ORT loads the model
            from ..targets.gpu.prewarm import prewarm

            prewarm(self.options.device_id)
        self.gpu_cc = _gpu_capability(self.options) if self.target_name == "gpu" else None
        # int8/fp8: read (and check) the calibration table once; its bytes' hash joins every cache key.
        self.calibration = load_table(self.options)
        if self.calibration is not None:
            self.options = replace(self.options, calibration_digest=self.calibration.digest)
        self.compiled: list[CompiledSubgraph] = []
        self.store = ProgramStore(self.options)
        self.last_partition: dict[str, Any] = {}
        # fused node name -> the graph its Compile received: control-flow bodies holding such nodes
        # are expanded back (see ep/subgraphs.py) so the control-flow node can be claimed whole.
        self.fused_graphs: dict[str, dict] = {}
        # The last graph GetCapability claimed whole, by signature, and its probe's value inputs.
        self._claimed_whole: tuple[tuple, dict[int, list[str]]] | None = None
        self._refusals = RefusalSummary()
        self.session: dict[str, str] = {}  # "ep.context_*" session entries (EPContext model writing)
        self.contexts_written = 0  # EPContext nodes handed to ORT (then a compatibility string too)

    def set_session_config(self, session: dict[str, str]) -> None:
        self.session = dict(session)

    def allocator_settings(self) -> dict:
        """For the shell's GPU allocator (csrc/device_memory.h): migraphx_mem_limit, the arena strategy and
        the external allocation functions (both or neither of alloc/free)."""
        o = self.options
        if bool(o.external_alloc) != bool(o.external_free):
            raise OptionError(
                f"{EP_NAME}: migraphx_external_alloc and migraphx_external_free must be given together "
                f"(got alloc={o.external_alloc:#x}, free={o.external_free:#x})"
            )
        return {
            "mem_limit": o.mem_limit,
            "power_of_two": o.arena_extend_strategy == "kNextPowerOfTwo",
            "external_alloc": o.external_alloc,
            "external_free": o.external_free,
            "external_empty_cache": o.external_empty_cache,
        }

    # -- GetCapability --------------------------------------------------------------------------
    def get_capability(self, graph: dict) -> list[list[int]]:
        check = None
        if self.target_name == "gpu":
            from ..targets.gpu.support import instruction_supported

            check = functools.partial(instruction_supported, cc=self.gpu_cc)
        graph, refuse = with_outer_scope_inputs(expand_fused(graph, self.fused_graphs))
        # EPContext nodes: ours are claimed alone (Compile checks and loads them); others' are not ours.
        contexts = [n["index"] for n in graph["nodes"] if is_our_context(n)]
        for n in graph["nodes"]:
            if is_context_node(n) and n["index"] not in contexts:
                refuse[n["index"]] = f"EPContext node of {n['attributes'].get('source', 'an unnamed EP')!r}"
        part = partition(graph, check, {**refuse, **{i: "EPContext" for i in contexts}})
        if part.needs_values is not None:  # claimed whole: its Compile need not parse it again
            self._claimed_whole = (graph_signature(graph), part.needs_values)
        for i in contexts:
            part.refused.pop(i, None)
            part.groups.append([i])
        self.last_partition = {"groups": part.groups, "refused": part.refused}
        if self.options.dump_model_ops:
            self._dump(graph, part.groups, part.refused)
        self._refusals.add(graph, part)
        if not graph.get("is_subgraph"):
            self._refusals.flush()
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
    def compile_program(
        self, prog: Program, options: EpOptions, tensors: Mapping[str, Instruction] | None = None
    ) -> None:
        # Timed and logged per new shape by the caller (CompiledSubgraph._build), parse included.
        if self.calibration is not None or options.fp16_enable or options.bf16_enable:
            with stage("quantize"):
                self._quantize(prog, options, tensors)
        target = self.target()
        if self.target_name == "gpu":
            from ..targets.gpu.support import unsupported

            reason = unsupported(prog.get_main_module(), self.gpu_cc)
            if reason is not None:
                # Only reachable for nodes claimed before their input values were known (value
                # specialisation): the partition could not ask the gpu target then. Right answers
                # on the ref target beat a failed Run; the warning names what runs there.
                log.warning("%s: %s; this subgraph runs on the ref target (CPU) instead", EP_NAME, reason)
                target = get_target("ref")
        prog.compile(target, exhaustive_tune=options.exhaustive_tune)

    def compile_optimised(self, prog: Program, options: EpOptions, target_name: str) -> None:
        """Lower a program whose passes already ran (an instantiated shape template) for the target
        its template's programs were compiled for."""
        target = self.target() if target_name == self.target_name else get_target(target_name)
        prog.compile(target, exhaustive_tune=options.exhaustive_tune, optimised=True)

    def _quantize(self, prog: Program, options: EpOptions, tensors: Mapping[str, Instruction] | None) -> None:
        if self.calibration is not None:
            # Before fp16/bf16, as the real EP: the scales belong to the model's float tensors.
            qtype = DType.int8_type if options.int8_enable else DType.fp8e4m3fn_type
            quantize_with_table(prog, tensors or {}, self.calibration, qtype, EP_NAME)
        if options.fp16_enable:
            quantize_fp16(prog)
        elif options.bf16_enable:
            quantize_bf16(prog)

    def target(self):
        if self.target_name == "gpu":
            return get_target("gpu", device_id=self.options.device_id, allow_tf32=self.options.tf32_enable)
        return get_target(self.target_name)

    def compile(self, graph: dict, fused_node_name: str) -> CompiledSubgraph:
        if len(graph["nodes"]) == 1 and is_our_context(graph["nodes"][0]):
            # A program made for something else is recompiled from the original model's partition.
            c = load_context(
                graph,
                fused_node_name,
                self.options,
                self.target_name,
                lambda source: self._compile_graph(source, fused_node_name),
            )
        else:
            c = self._compile_graph(graph, fused_node_name)
        self.compiled.append(c)
        return c

    def _compile_graph(self, graph: dict, fused_node_name: str) -> CompiledSubgraph:
        graph = expand_fused(graph, self.fused_graphs)
        self.fused_graphs[fused_node_name] = graph
        whole, self._claimed_whole = self._claimed_whole, None
        return CompiledSubgraph(
            graph,
            fused_node_name,
            self.options,
            self.compile_program,
            self.store,
            self.target_name,
            compile_optimised=self.compile_optimised,
            needs_values=whole[1] if whole is not None and whole[0] == graph_signature(graph) else None,
        )

    def ep_context(self, compiled: CompiledSubgraph, fused_node_name: str) -> dict:
        """The EPContext node replacing ``compiled`` in the model ORT is writing (ModelCompiler)."""
        compiled.settle()  # timed library picks in the file, not the quick ones of the first compile
        node = context_node(compiled, fused_node_name, self.options, self.target_name, self.session)
        self.contexts_written += 1
        return node

    def compatibility_info(self) -> str:
        """The string ORT stores in the EPContext model this session wrote (ep/compat.py); none when it
        holds no node of ours, so ORT asks nothing of us when loading it."""
        return str(session_info(self.options, self.target_name)) if self.contexts_written else ""


class RefusalSummary:
    """One warning per session for the nodes left to other providers, not one per GetCapability call.

    ORT offers control-flow bodies before the graph holding them and may offer a graph twice; bodies
    are gathered and reported with their enclosing graph, and an unchanged summary is not repeated.
    Our own fused nodes (offered again in later rounds) are not refusals."""

    def __init__(self) -> None:
        self.nodes = 0
        self.claimed = 0
        self.partitions = 0
        self.refused: collections.Counter[str] = collections.Counter()
        self._last = ""

    def add(self, graph: dict, part: Partition) -> None:
        ops = {n["index"]: n for n in graph["nodes"] if not is_ours(n)}
        self.nodes += len(ops)
        self.claimed += sum(len(g) for g in part.groups)
        self.partitions += len(part.groups)
        self.refused.update(ops[i]["op_type"] for i in part.refused if i in ops)

    def flush(self) -> None:
        if self.refused:
            text = (
                f"{EP_NAME}: claimed {self.claimed} of {self.nodes} nodes in {self.partitions} "
                f"partition(s); {sum(self.refused.values())} left to other providers: "
                + ", ".join(f"{op} x{n}" for op, n in self.refused.most_common())
                + " (ORT_MIGRAPHX_DUMP_MODEL_OPS=1 lists each node with its reason)"
            )
            if text != self._last:
                log.warning("%s", text)
                self._last = text
        self.nodes = self.claimed = self.partitions = 0
        self.refused.clear()


def create_ep(options: dict[str, str]) -> MIGraphXEp:
    return MIGraphXEp(options)


def validate_compatibility(info: bytes) -> int:
    """The factory's verdict on a compiled model's compatibility string (an OrtCompiledModelCompatibility)."""
    return int(validate(info))
