"""Names of the node features slurm-aigc publishes, and which features are ours.

Static features (the agent, from the node's own GPUs):

* GPU type: `a100`, `h100`, `t4`, `l40s`, `rtx3090` ... (from the NVML name);
* memory class: `vram<N>g` with N the marketed size in GB (`vram80g`, `vram16g`);
* NVLink: `nvlink` when the node has an NVLink island of 2+ GPUs, and `nvlink<N>` with N
  the size of its largest island (`nvlink8` on a DGX/HGX A100) when its islands are runs of
  consecutive indices, as the publisher reads them back (`consecutive_islands`).

Dynamic features (the publisher, from allocations and jobs):

* `nvfree<k>` for every power of two k >= 2 up to N, and `nvfree<N>` itself, where N is the
  size of the largest set of free GPUs connected by NVLink (6 free -> nvfree2,nvfree4,nvfree6),
  so `--constraint=nvfree4` finds any node with at least 4 connected free GPUs;
* `model_<id>` for each model served on the node (id from the job comment tag `model=`).

Ownership rule: a feature is the agent's when it matches `nvlink\\d*` or `vram\\d+g` or is `mig`, is a
GPU type in `GPU_TYPE_FEATURES`, or is a GPU type this node's agent published itself (its
record, below); it is the publisher's when it matches `nvfree\\d+` or `model_...`. Every
other feature is an admin's and is never removed. Each writer replaces only its own kind,
merging into what Slurm reports just before the write.

The record: `gpu_type_feature` names any GPU (`NVIDIA RTX PRO 6000 Blackwell` -> `rtxpro`,
`NVIDIA B300` -> `b300`, neither in `GPU_TYPE_FEATURES`); were only the list recognised as
ours, such a name would stay on the node forever once its GPUs were swapped out. So the agent keeps the type names it has written in
its own state directory (`$STATE_DIRECTORY`, the unit's `StateDirectory=`, mode 0700), one
file per node: `published-types.<node>.json`. A name is recorded before the `scontrol update`
that adds it and dropped after the update that withdraws it (or once Slurm no longer shows
it), so a crash in between leaves a recorded name that Slurm lacks, which costs nothing, and
never a published name that is not recorded. The state survives restarts; the file is the
agent's alone, so no slurmctld RPC is added and no other writer's feature can be claimed by
it. A name the agent has published is the agent's from then on, also where an admin set the
same name. Without a state directory (`$STATE_DIRECTORY` unset) the record lives only in
memory: what an earlier run published outside the list is not withdrawn.

GPUs in MIG mode (`GpuReading.mig`) give the feature `mig` and neither their type, nor a memory
class, nor NVLink: a MIG GPU's memory and compute are split into instances that Slurm hands to
different jobs, and instances talk to no other GPU over NVLink, so `a100` (which the hook's
`vram_fit` reads as 80 GB of one GPU), `vram80g` or `nvlink8` would promise what no job on that
GPU gets. A node with whole GPUs beside MIG ones keeps their type and memory class, and shows
`mig` so that users and admins can see it (a partition without such nodes keeps the jobs the
hook fits by VRAM off them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence

from slurm_aigc.units import MIB_PER_GIB

# GPU type features we recognise as ours (derived by `gpu_type_feature`).
GPU_TYPE_FEATURES = frozenset({
    "a2", "a10", "a16", "a30", "a40", "a100", "a800", "b100", "b200", "gb200", "gh200",
    "h20", "h100", "h200", "h800", "l4", "l20", "l40", "l40s", "t4", "v100", "v100s",
    "p4", "p40", "p100", "k80", "m60", "rtx3090", "rtx4090", "rtx5090", "rtxa4000",
    "rtxa5000", "rtxa6000", "rtx6000", "rtx8000",
})

# Marketed memory sizes in GB; a GPU reports a little less (a T4 has 15360 MiB).
_MEMORY_CLASSES_GB = (4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 120, 141, 144, 180, 192, 288)

MIG_FEATURE = "mig"
_STATIC_RE = re.compile(r"^(nvlink\d*|vram\d+g|mig)$")
_DYNAMIC_RE = re.compile(r"^(nvfree\d+|model_[A-Za-z0-9_.\-]+)$")
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}
_UNSAFE_RE = re.compile(r"[^A-Za-z0-9_.\-]+")
MAX_FEATURE_LEN = 64


def gpu_type_feature(name: str | None) -> str | None:
    """'NVIDIA A100-SXM4-80GB' -> 'a100', 'Tesla T4' -> 't4', 'NVIDIA GeForce RTX 3090' -> 'rtx3090'."""
    if not name:
        return None
    words = [w for w in re.split(r"[\s_]+", name.strip().lower()) if w and w not in _VENDOR_WORDS]
    if not words:
        return None
    first = words[0].split("-", 1)[0]
    if first == "rtx" and len(words) > 1:
        first = "rtx" + words[1].split("-", 1)[0]
    cleaned = re.sub(r"[^a-z0-9]", "", first)
    return cleaned or None


def memory_class_feature(memory_total_mib: float | None) -> str | None:
    """81920 MiB -> 'vram80g'; 15360 MiB (a T4) -> 'vram16g'; the marketed size in GB."""
    if not memory_total_mib or memory_total_mib <= 0:
        return None
    gib = memory_total_mib / MIB_PER_GIB
    size = next((c for c in _MEMORY_CLASSES_GB if c >= gib - 0.5), round(gib))
    return f"vram{size}g"


def nvlink_features(islands: Sequence[Sequence[int]]) -> tuple[str, ...]:
    """[[0..7]] -> ('nvlink', 'nvlink8'); only singletons (PCIe) -> ()."""
    largest = max((len(island) for island in islands), default=0)
    return ("nvlink", f"nvlink{largest}") if largest >= 2 else ()


def consecutive_islands(islands: Sequence[Sequence[int]], gpu_count: int,
                        skip: Collection[int] = frozenset()) -> list[list[int]]:
    """The islands the publisher can assume from `nvlink<N>`: runs of N consecutive GPU indices
    from GPU 0 (`publish_plan.islands_from_features`, which knows no more than the feature), N the
    largest size for which every run lies within one of the real `islands`. GPUs in `skip` (MIG
    mode) are left out of the runs.

    Every board seen so far numbers its islands so (DGX-1 quads, NVSwitch, bridge pairs): then
    this is the real layout. A board whose bridges pair GPU0 with GPU2 gets the size at which the
    assumption holds (none: no `nvlink` feature), never `nvfree2` on two GPUs without a link.
    """
    where = {gpu: number for number, island in enumerate(islands) for gpu in island}
    for size in range(max((len(island) for island in islands), default=1), 1, -1):
        runs = [[gpu for gpu in range(start, min(start + size, gpu_count)) if gpu not in skip]
                for start in range(0, gpu_count, size)]
        if all(len(run) <= 1 or (run[0] in where and {where.get(gpu) for gpu in run} == {where[run[0]]})
               for run in runs):
            return [run for run in runs if run]
    return [[gpu] for gpu in range(gpu_count) if gpu not in skip]


def nvfree_features(largest_free_set: int) -> tuple[str, ...]:
    """6 -> ('nvfree2', 'nvfree4', 'nvfree6'); below 2 -> ()."""
    if largest_free_set < 2:
        return ()
    sizes = {largest_free_set}
    k = 2
    while k <= largest_free_set:
        sizes.add(k)
        k *= 2
    return tuple(f"nvfree{s}" for s in sorted(sizes))


def model_feature(model_id: str) -> str | None:
    """'meta-llama/Llama-3-8B' -> 'model_meta-llama_Llama-3-8B'; None when nothing usable is left."""
    cleaned = _UNSAFE_RE.sub("_", model_id.strip()).strip("_")
    if not cleaned:
        return None
    return ("model_" + cleaned)[:MAX_FEATURE_LEN]


def is_static_feature(feature: str, published_types: Collection[str] = frozenset()) -> bool:
    """Owned by the agent (see the module docstring); `published_types` is the node agent's record."""
    return bool(_STATIC_RE.match(feature)) or feature in GPU_TYPE_FEATURES or feature in published_types


def is_nvlink_feature(feature: str) -> bool:
    """`nvlink` or `nvlink<N>`: the agent's, from the topology."""
    return feature == "nvlink" or (feature.startswith("nvlink") and feature[6:].isdigit())


def is_dynamic_feature(feature: str) -> bool:
    """Owned by the publisher (see the module docstring)."""
    return bool(_DYNAMIC_RE.match(feature))


def merge_features(current: Sequence[str], ours: Iterable[str], is_ours: Callable[[str], bool]) -> tuple[str, ...]:
    """Keep every feature that is not ours in its order, then append ours (sorted, unique)."""
    kept = [f for f in current if not is_ours(f)]
    wanted = sorted({f for f in ours if f not in kept})
    return tuple(kept + wanted)


def same_features(a: Iterable[str], b: Iterable[str]) -> bool:
    """Slurm does not promise an order; compare as sets."""
    return set(a) == set(b)
