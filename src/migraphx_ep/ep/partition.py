"""Which nodes the EP claims: supported nodes grouped into maximal *convex* partitions.

ORT drops every claim of a GetCapability call if some group has an outside node on a path between
two of its nodes, so convexity is checked with ancestor/descendant bitsets (Python ints).
Support is decided by the frontend itself (a tolerant probe parse), so a claimed node is one the
compiler has already translated once: the parser is the single source of truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..frontend.parser import ParseResult, topo_order
from ..frontend.probe import probe_parse
from ..ir.instruction import Instruction

Check = Callable[[Instruction], "str | None"]

MAX_ROUNDS = 8


@dataclass
class Partition:
    groups: list[list[int]]  # node indices, each group in topological order
    refused: dict[int, str] = field(default_factory=dict)  # node index -> reason
    # Where every node is claimed in one group: the inputs whose values nodes need (the probe's
    # ``needs_values``), which the compile of that group would otherwise parse the graph again to learn.
    needs_values: dict[int, list[str]] | None = None


def graph_signature(graph: dict) -> tuple:
    """What tells the graph GetCapability saw from the one a Compile gets, within one session: the nodes
    (ORT's indices and names, ops, wiring), the inputs that are not initializers (a fused node lists its
    initializers among its inputs, in another order), the outputs, and the initializers' names, types and
    dims. ORT hands both calls the same nodes, so equal signatures mean the same graph."""
    inits = graph.get("initializers", {})
    return (
        tuple(
            (n["index"], n["name"], n["op_type"], n["domain"], tuple(n["inputs"]), tuple(n["outputs"]))
            for n in graph["nodes"]
        ),
        frozenset(i for i in graph["inputs"] if i not in inits),
        tuple(graph["outputs"]),
        frozenset(
            (k, str(getattr(a, "dtype", type(a))), getattr(a, "shape", None)) for k, a in inits.items()
        ),
    )


def _edges(nodes: list[dict]) -> tuple[list[list[int]], list[int]]:
    """Producer lists per node (by position) and a topological order of positions."""
    pos_of = {n["index"]: p for p, n in enumerate(nodes)}
    produced = {o: pos_of[n["index"]] for n in nodes for o in n["outputs"] if o}
    preds: list[list[int]] = []
    for n in nodes:
        deps = list(n["inputs"]) + list(n.get("implicit_inputs", ()))
        preds.append(sorted({produced[d] for d in deps if d in produced}))
    order = [pos_of[n["index"]] for n in topo_order(nodes, ())]
    return preds, order


def _bits(mask: int) -> Iterator[int]:
    """The positions of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def convex_groups(nodes: list[dict], supported: set[int]) -> list[list[int]]:
    """Greedy topological clustering of supported nodes into convex groups (by node index)."""
    preds, order = _edges(nodes)
    n = len(nodes)
    anc = [0] * n  # ancestors including self
    for p in order:
        a = 1 << p
        for q in preds[p]:
            a |= anc[q]
        anc[p] = a
    succs: list[list[int]] = [[] for _ in range(n)]
    for p in range(n):
        for q in preds[p]:
            succs[q].append(p)
    desc = [0] * n  # descendants including self
    for p in reversed(order):
        d = 1 << p
        for q in succs[p]:
            d |= desc[q]
        desc[p] = d

    group_of: dict[int, int] = {}
    members: list[int] = []  # bitmask of each group
    g_anc: list[int] = []
    g_desc: list[int] = []

    def convex(mask: int, a: int, d: int) -> bool:
        return (a & d) & ~mask == 0  # nothing outside lies between two members

    for p in order:
        if nodes[p]["index"] not in supported:
            continue
        cands = sorted(
            {group_of[q] for q in preds[p] if q in group_of}, key=lambda g: -members[g].bit_count()
        )
        placed = None
        if cands:
            mask, a, d = 1 << p, anc[p], desc[p]
            for g in cands:
                mask, a, d = mask | members[g], a | g_anc[g], d | g_desc[g]
            if convex(mask, a, d):  # join all producer groups at once
                placed = cands[0]
                for g in cands[1:]:
                    for q in _bits(members[g]):  # a member's bits, not every node's: BERT-base's
                        group_of[q] = placed  # ~950 nodes made the old scan most of the partition
                    members[g] = g_anc[g] = g_desc[g] = 0
                members[placed], g_anc[placed], g_desc[placed] = mask, a, d
            else:
                for g in cands:
                    mask, a, d = members[g] | 1 << p, g_anc[g] | anc[p], g_desc[g] | desc[p]
                    if convex(mask, a, d):
                        placed = g
                        members[g], g_anc[g], g_desc[g] = mask, a, d
                        break
        if placed is None:
            placed = len(members)
            members.append(1 << p)
            g_anc.append(anc[p])
            g_desc.append(desc[p])
        group_of[p] = placed

    groups: dict[int, list[int]] = {}
    for p in order:
        if p in group_of:
            groups.setdefault(group_of[p], []).append(nodes[p]["index"])
    return [g for g in groups.values() if g]


def _probe(graph: dict, pins: dict[str, int], **kw) -> tuple[dict[int, str], ParseResult]:
    """Refusals of a tolerant parse that hold for two unrelated choices of symbolic sizes.

    A symbolic dim has no size until Run, so a shape check in the probe (a pooling window larger than
    the input, a concat of dims that differ) can fail for made-up sizes that real inputs never have.
    A node refused for one choice but accepted for the other is claimed: its per-shape compile runs
    the same checks on real dims, and a failure there is an error naming the node, never a wrong number.
    A symbol some node needs at one size (``pins``, see ``probe_parse``) has that size in both.
    Also returns the first parse's result."""
    first = probe_parse(graph, pins=pins, **kw)
    if not first.refused:
        return first.refused, first
    large = probe_parse(graph, large=True, pins=pins, **kw).refused
    return {i: r for i, r in first.refused.items() if i in large}, first


def partition(graph: dict, check: Check | None = None, refuse: dict[int, str] | None = None) -> Partition:
    """Probe-parse, group, then re-probe with group boundaries until claims are stable.

    ``check`` is the target's veto on single instructions (the gpu target's missing kernels);
    ``refuse`` names nodes refused up front (node index -> reason)."""
    nodes = graph["nodes"]
    all_idx = {n["index"] for n in nodes}
    pins: dict[str, int] = {}
    probed, first = _probe(graph, pins, specialize=True, check=check)
    refused: dict[int, str] = {**probed, **(refuse or {})}
    groups: list[list[int]] = []
    for _ in range(MAX_ROUNDS):
        groups = convex_groups(nodes, all_idx - set(refused))
        if not refused and len(groups) == 1 and not any(n.get("subgraphs") for n in nodes):
            # Every node in one group: the group-aware probe would parse the same graph again with
            # nothing crossing a boundary, and refuse what the first probe refused, i.e. nothing (a
            # control-flow body is not skipped: its nodes have no group, so outer values read in it
            # cross one). One parse of a large graph saved per session (BERT-base: 0.07-0.1 s); and
            # the compile of this one group learns its value inputs from the same parse (another one).
            # The gpu target's ``check`` vetoed nothing here (nothing is refused), so the parse is
            # what the compile's own, without it, would give.
            return Partition(groups, {}, first.needs_values)
        group_of = {i: g for g, members in enumerate(groups) for i in members}
        probed, _ = _probe(
            graph, pins, claimed=set(group_of), group_of=group_of, specialize=True, check=check
        )
        newly = {i: r for i, r in probed.items() if i in group_of}
        if not newly:
            break
        for i, r in newly.items():
            refused[i] = f"{r} (within its partition)" if "constant" in r else r
    else:  # claims never settled: claiming nothing is the only answer known to be right
        for g in groups:
            for i in g:
                refused.setdefault(i, "partitioning did not converge")
        groups = []
    return Partition(groups, {i: r for i, r in refused.items() if i in all_idx})
