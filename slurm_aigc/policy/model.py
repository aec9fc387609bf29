"""The typed policy: what etc/slurm-aigc.yaml says about classes, detection and rewrites."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

BASE_CLASSES = ("train", "finetune", "infer", "imagegen", "videogen", "audio", "batch", "interactive")
UNKNOWN_CLASS = "unknown"
NvlinkMethod = Literal["types", "feature"]


@dataclass(frozen=True)
class GpuType:
    """One GPU type of the cluster: the `Type=` of gres.conf and what the hook needs to know of it."""

    name: str
    memory_gib: float
    shards_per_gpu: int
    nvlink: bool
    feature: str | None  # node feature that selects this type in --constraint (None: cannot)
    nodes: str  # hostlist, documentation only for now

    @property
    def gib_per_shard(self) -> float:
        return self.memory_gib / self.shards_per_gpu if self.shards_per_gpu else 0.0


@dataclass(frozen=True)
class Inventory:
    gpu_types: tuple[GpuType, ...]  # sorted by memory, smallest first
    shard_gres: str = "shard"


@dataclass(frozen=True)
class ClassDefaults:
    """Per-class defaults applied only when the user did not set the field."""

    partition: str | None = None
    qos: str | None = None
    time_minutes: int | None = None


@dataclass(frozen=True)
class DetectionRule:
    """Classify an untagged job: every condition given must hold; the first matching rule wins."""

    class_name: str
    name_globs: tuple[str, ...] = ()
    min_gpus: int | None = None
    max_gpus: int | None = None
    interactive: bool | None = None


@dataclass(frozen=True)
class ShardRule:
    enabled: bool = True
    classes: tuple[str, ...] = ("infer", "imagegen")
    max_fraction: float = 0.5


@dataclass(frozen=True)
class VramFitRule:
    enabled: bool = True
    reject_misfit: bool = False  # in strict mode, reject a typed request that cannot hold vram


@dataclass(frozen=True)
class NvlinkRule:
    enabled: bool = True
    classes: tuple[str, ...] = ("train", "finetune")
    method: NvlinkMethod = "types"
    feature: str = "nvlink"


@dataclass(frozen=True)
class Toggle:
    enabled: bool = True


DEFAULT_PUBLISHED_FEATURES_FILE = "/var/lib/slurm-aigc/published-features.txt"


@dataclass(frozen=True)
class ModelPreferRule:
    """model=X -> --prefer model_X, only while the publisher lists model_X (else Slurm rejects the job)."""

    enabled: bool = True
    feature_prefix: str = "model_"
    published_features_file: str | None = DEFAULT_PUBLISHED_FEATURES_FILE  # None: trust every model
    refresh_seconds: int = 10


@dataclass(frozen=True)
class Rewrites:
    shard: ShardRule = ShardRule()
    vram_fit: VramFitRule = VramFitRule()
    nvlink: NvlinkRule = NvlinkRule()
    model_prefer: ModelPreferRule = ModelPreferRule()
    class_defaults: Toggle = Toggle()
    comment_class: Toggle = Toggle()


@dataclass(frozen=True)
class HookSettings:
    strict_tags: bool = False
    debug_log: bool = False
    skip_root: bool = True
    untouched_classes: tuple[str, ...] = ("interactive", UNKNOWN_CLASS)
    comment_class_key: str = "aigc_class"


@dataclass(frozen=True)
class StorageConfig:
    """The `storage:` section: how long the state database keeps what."""

    # Raw per-GPU samples older than this are rolled up and deleted; the reclaim windows
    # (reclaim.*.window_s) and `slurm-aigc report` of recent jobs need less than this.
    raw_retention_hours: float = 48.0


@dataclass(frozen=True)
class Policy:
    source: str
    inventory: Inventory
    classes: Mapping[str, ClassDefaults]
    detection: tuple[DetectionRule, ...]
    rewrites: Rewrites
    hook: HookSettings
    storage: StorageConfig = StorageConfig()
    # Typed configs of the sections other packages own (reclaim, scoring, agent), when importable.
    sections: Mapping[str, object] = field(default_factory=dict)
