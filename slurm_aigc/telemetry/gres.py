"""Slurm's GRES strings: what a node has, what is in use, which GPU indices a job holds.

`scontrol -d show node` prints `Gres=gpu:a100:8(S:0-1),shard:a100:640` and
`GresUsed=gpu:a100:2(IDX:0-1),shard:a100:8(8/80,0/80,...)`; a job's `gres_detail` (the
JSON form of `scontrol -d show job`'s per-node `GRES=`, see `JobInfo`) holds one such
string per node. These strings come from slurmctld, never from user text. Parsing is
pure and tolerant: an entry it cannot read counts as nothing rather than failing a cycle.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from slurm_aigc.slurmrecords import JobInfo

LOG = logging.getLogger(__name__)


def split_gres(text: str) -> list[str]:
    """`gpu:a100:2(IDX:0-1,4),shard:a100:8(8/80,0/80)` -> its entries (commas in parentheses kept)."""
    entries, depth, start = [], 0, 0
    for position, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            entries.append(text[start:position])
            start = position + 1
    entries.append(text[start:])
    return [entry.strip() for entry in entries if entry.strip() and entry.strip() != "(null)"]


def _gres_parts(entry: str) -> tuple[str, int, str]:
    """'gpu:a100:2(IDX:0-1)' -> ('gpu', 2, 'IDX:0-1'); a count that is not a number reads 0."""
    head, _, rest = entry.partition("(")
    detail = rest.rsplit(")", 1)[0] if rest else ""
    parts = head.split(":")
    count_text = parts[-1] if len(parts) > 1 else "1"
    count_text = re.sub(r"[^0-9].*$", "", count_text)  # `gpu:8(S:0-1)` and `gpu:a100:8` alike
    return parts[0], int(count_text) if count_text else 0, detail


def parse_index_list(text: str) -> frozenset[int]:
    """'0-1,4' -> {0, 1, 4}; 'N/A' or garbage -> {}."""
    indices: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            indices.update(range(int(low), int(high or low) + 1))
    return frozenset(indices)


def gres_gpu_total(gres: str) -> int:
    """GPUs a node has, from `Gres=gpu:a100:8(S:0-1),shard:a100:640`."""
    return sum(count for name, count, _ in map(_gres_parts, split_gres(gres)) if name == "gpu")


def gres_busy_gpus(gres_used: str) -> tuple[int, frozenset[int]]:
    """(GPUs allocated, known busy indices) from `GresUsed`.

    A GPU is busy when it is allocated whole (`gpu:a100:2(IDX:1-2)`) or when any of its
    shards is (`shard:a100:1(IDX:0)` on Slurm 22.05; 24.11 prints one used/total pair per
    GPU, `shard:a100:8(8/80,0/80,...)`): Slurm gives a GPU as a gpu or as shards, never
    both at once.
    """
    whole, busy = 0, set[int]()
    for name, count, detail in map(_gres_parts, split_gres(gres_used)):
        if name == "gpu":
            whole += count
        if name in ("gpu", "shard"):
            busy |= used_indices(detail)
    return max(whole, len(busy)), frozenset(busy)


def used_indices(detail: str) -> frozenset[int]:
    """GPU indices in use from the parenthesised part: `IDX:0-1,4` or `8/80,0/80,...`."""
    if detail.startswith("IDX:"):
        return parse_index_list(detail[4:])
    if "/" in detail:
        return frozenset(i for i, pair in enumerate(detail.split(",")) if pair.split("/")[0].strip() not in ("", "0"))
    return frozenset()


def gres_indices(gres: str) -> frozenset[int]:
    """GPU indices of one node's part of a job, `gpu:a100:2(IDX:0-1)` -> {0, 1}.

    GPUs held through shards count too (`shard:10(IDX:0)` on 22.05, `shard:8(8/16,0/16)` on 24.11).
    """
    indices: set[int] = set()
    for name, _count, detail in map(_gres_parts, split_gres(gres)):
        if name in ("gpu", "shard"):
            indices |= used_indices(detail)
    return frozenset(indices)


def job_gpu_indices(job: JobInfo, node: str) -> frozenset[int]:
    """The GPU indices `job` holds on `node`, from its per-node `gres_detail` (`scontrol -d`'s GRES=)."""
    return frozenset().union(*(gres_indices(gres) for name, gres in job.gres_detail if name == node))


def job_whole_and_shard_gpus(job: JobInfo) -> tuple[tuple[str, frozenset[int], frozenset[int]], ...]:
    """Per node, (node, GPU indices `job` holds whole, GPU indices it holds through shards), from `gres_detail`."""
    return _whole_and_shard_gpus(job.gres_detail)


# The controller reads every running job's holdings each tick; a job's `gres_detail` does not
# change while it runs, so the parse is done once per allocation.
@lru_cache(maxsize=65536)
def _whole_and_shard_gpus(gres_detail: tuple[tuple[str, str], ...]) -> tuple[tuple[str, frozenset[int], frozenset[int]], ...]:
    held: dict[str, tuple[frozenset[int], frozenset[int]]] = {}
    for node, gres in gres_detail:
        whole, shards = held.get(node, (frozenset(), frozenset()))
        for name, _count, detail in map(_gres_parts, split_gres(gres)):
            if name == "gpu":
                whole |= used_indices(detail)
            elif name == "shard":
                shards |= used_indices(detail)
        held[node] = (whole, shards)
    return tuple((node, whole, shards) for node, (whole, shards) in held.items())


def alloc_tres_gpus(alloc_tres: str) -> int:
    """GPUs allocated on a node from `AllocTRES=cpu=4,gres/gpu=2,gres/gpu:a100=2` (0 when absent)."""
    match = re.search(r"(?:^|,)gres/gpu=(\d+)", alloc_tres)
    return int(match.group(1)) if match else 0


def expand_nodes(node_list: str) -> list[str]:
    """`a100-[01-02]` -> ['a100-01', 'a100-02']; an unparsable list -> [] (logged)."""
    if not node_list or node_list in {"(null)", "None assigned"}:
        return []
    try:
        return list(NodeSet(node_list))
    except NodeSetParseError as error:
        LOG.warning("cannot expand node list %r: %s", node_list, error)
        return []


def node_gpu_allocations(jobs: Iterable[JobInfo], node: str) -> Mapping[str, frozenset[int]]:
    """Running jobs' GPU indices on `node` (jobs as `SlurmCli.jobs()` reads them)."""
    allocations: dict[str, frozenset[int]] = {}
    for job in jobs:
        indices = job_gpu_indices(job, node) if job.state == "RUNNING" else frozenset()
        if indices:
            allocations[job.job_id] = indices
    return allocations
