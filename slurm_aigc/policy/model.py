"""The typed policy: every section of etc/slurm-aigc.yaml as frozen values.

Each setting has exactly one default, here; the shipped etc/slurm-aigc.yaml states the same
values (tests/unit/test_policy_loader.py checks they are equal). `slurm_aigc.policy.loader`
fills these from the file; nothing else reads it.
"""

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


SHARD_GRES = "shard"  # Slurm's GPU-sharing GRES (gres/shard, Slurm >= 22.05)


@dataclass(frozen=True)
class Inventory:
    gpu_types: tuple[GpuType, ...]  # sorted by memory, smallest first
    shard_gres: str = SHARD_GRES


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


# The largest |nice| Slurm accepts (NICE_OFFSET - 3; `sbatch --nice` is refused beyond it).
SLURM_MAX_NICE = 2147483645


@dataclass(frozen=True)
class ShardRule:
    enabled: bool = True
    classes: tuple[str, ...] = ("infer", "imagegen")
    max_fraction: float = 0.5
    # SM fraction (0..1] a job of the class uses while it computes. Shards isolate nothing, so
    # the hook asks for at least this share of a GPU's shards: co-tenants' expected SM then sums
    # to at most 1 and busy phases overlap without slowing each other (docs/hook.md).
    expected_sm: Mapping[str, float] = field(default_factory=lambda: {"infer": 0.5, "imagegen": 0.9})
    # A class (or a job's learned SM) above this is never shared: at most one such job fits a
    # GPU anyway, and a whole GPU is then the honest request.
    max_sm: float = 0.5
    # Nice the hook gives a job it shards (< 0: ahead in the queue), unless the user set one. With
    # priority/basic one point is one place in the queue; multifactor sites weigh it against
    # their PriorityWeight* (docs/hook.md). Off: -100 cut shard jobs' waits by a quarter but cost
    # 10-20 % of the work completed in the 16-node benchmark (docs/benchmarks.md).
    nice: int = 0


@dataclass(frozen=True)
class VramFitRule:
    enabled: bool = True
    reject_misfit: bool = False  # in strict mode, reject a typed request that cannot hold vram


# The first Slurm release measured to keep a GPU from whole-GPU jobs until its last shard job
# ends (24.11.5; 22.05.8 does not, docs/hook.md; 23.02 to 24.05 were not measured).
SHARD_DEFECT_FIXED_IN = (24, 11)


@dataclass(frozen=True)
class WholeAsShardsRule:
    """A one-GPU whole job asks for all the shards of one GPU type (the Slurm 22.05 shard defect).

    `auto`: on where the Slurm release the hook is rendered for is older than
    SHARD_DEFECT_FIXED_IN, off where it is not or is unknown."""

    enabled: bool | Literal["auto"] = "auto"

    def applies(self, slurm_version: tuple[int, ...] | None) -> bool:
        if self.enabled != "auto":
            return bool(self.enabled)
        return slurm_version is not None and tuple(slurm_version[:2]) < SHARD_DEFECT_FIXED_IN


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
    whole_as_shards: WholeAsShardsRule = WholeAsShardsRule()
    model_prefer: ModelPreferRule = ModelPreferRule()
    class_defaults: Toggle = Toggle()


@dataclass(frozen=True)
class HookSettings:
    strict_tags: bool = False
    debug_log: bool = False
    skip_root: bool = True
    untouched_classes: tuple[str, ...] = ("interactive", UNKNOWN_CLASS)


# --------------------------------------------------------------------------- reclaim

VERDICTS = ("idle", "memory_held", "fake_busy", "over_allocated", "over_memory", "gpu_conflict")
ACTIONS = ("notify", "signal", "requeue", "shrink", "cancel")
UNCLASSIFIED = "unclassified"


def _default_ladder() -> Mapping[str, tuple[str, ...]]:
    return {
        "idle": ("notify", "requeue"),
        "memory_held": ("notify", "requeue"),
        "fake_busy": ("notify", "signal", "requeue"),
        "over_allocated": ("notify", "shrink"),
        # A shard job over its shards' GiB starves its neighbours: requeue it, never them.
        "over_memory": ("notify", "requeue"),
        # A shard job on a GPU Slurm 22.05 also gave whole to another job (reclaim/gpuconflict.py):
        # requeue it at once, before either runs out of memory.
        "gpu_conflict": ("requeue",),
    }


@dataclass(frozen=True)
class ClassPolicy:
    """Windows, thresholds and action ladders for one AIGC class (`reclaim.defaults`)."""

    grace_s: float = 600.0  # start-up grace: model loading looks idle
    window_s: float = 1800.0  # how long a waste pattern must last
    min_samples: int = 30
    idle_util_pct: float = 1.0
    idle_memory_mib: float = 1024.0
    busy_util_pct: float = 95.0
    low_power_pct: float = 30.0
    ladder: Mapping[str, tuple[str, ...]] = field(default_factory=_default_ladder)


@dataclass(frozen=True)
class Exemptions:
    """Jobs reclaim never touches (it still reports their verdicts)."""

    classes: frozenset[str] = frozenset({"interactive"})
    accounts: frozenset[str] = frozenset()
    qos: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NotifyConfig:
    """How `notify` reaches the user besides the job's AdminComment (always set)."""

    scontrol_notify: bool = True
    # argv template; {user} {job_id} {message} {verdict} are substituted per argument.
    command: tuple[str, ...] = ()


# A controller renews its leases every tick: a lease must outlast this many ticks (reclaim.
# lease_intervals), so that one slow tick or one failed renewal does not hand its work to a standby.
LEASE_TICKS = 3

# agent.interval_s, defined before ReclaimConfig: reclaim.poll_interval_s and the reports'
# sample slices (report.records) assume the same interval.
DEFAULT_AGENT_INTERVAL_S = 10.0


@dataclass(frozen=True)
class ReclaimConfig:
    """The whole `reclaim:` section."""

    dry_run: bool = True  # a new install only reports
    poll_interval_s: float = DEFAULT_AGENT_INTERVAL_S  # the agents' sampling interval (agent.interval_s)
    gap_intervals: float = 2.0
    stale_intervals: float = 6.0
    max_actions_per_tick: int = 10
    max_actions_per_job: int = 4
    cooldown_s: float = 900.0
    cancel_enabled: bool = False
    signal: str = "USR1"
    opt_out: str = "allow"
    notify: NotifyConfig = NotifyConfig()
    exempt: Exemptions = Exemptions()
    defaults: ClassPolicy = ClassPolicy()
    classes: Mapping[str, ClassPolicy] = field(default_factory=dict)
    # Memory guard: a shard job above its shards' GiB for this many consecutive samples is
    # `over_memory` (one sample can be a transient peak; shards isolate nothing).
    over_memory_samples: int = 3
    # ... and above them by more than this per GPU: the CUDA context every process holds outside
    # its framework's memory fraction (measured 0.5-0.6 GiB on an H200, memguard's docstring).
    over_memory_allowance_mib: float = 1024.0
    # A shard job on a GPU Slurm 22.05 also gave whole to another job is `gpu_conflict` once the
    # two jobs' memory there reaches this share of the GPU's (reclaim/gpuconflict.py says why not
    # at once); 0: on every conflict.
    gpu_conflict_memory_pct: float = 90.0
    # Controllers against one database take turns (slurm_aigc/lease.py): a part's lease not
    # renewed for this many ticks is free to a standby (at least LEASE_TICKS).
    lease_intervals: float = 6.0
    # From the policy's `inventory` (not reclaim keys): shards into GPU-hours recovered, and
    # GiB per shard per GPU type (the memory a shard job may use: the memory guard's limit).
    shards_per_gpu: Mapping[str, int] = field(default_factory=dict)
    gib_per_shard: Mapping[str, float] = field(default_factory=dict)

    @property
    def gap_s(self) -> float:
        """A longer gap between two samples breaks any window."""
        return self.gap_intervals * self.poll_interval_s

    @property
    def stale_s(self) -> float:
        """Samples older than this are stale: the controller waits instead of acting."""
        return self.stale_intervals * self.poll_interval_s

    def lease_s(self, tick_s: float | None = None) -> float:
        """How long a lease lasts unrenewed, for a controller ticking every `tick_s` (None:
        poll_interval_s, the shipped unit's)."""
        return self.lease_intervals * (self.poll_interval_s if tick_s is None else tick_s)

    def policy_for(self, job_class: str) -> ClassPolicy:
        return self.classes.get(job_class, self.defaults)

    def lookback_s(self) -> float:
        """How far back the controller must read samples to judge every class."""
        windows = [self.defaults.window_s] + [p.window_s for p in self.classes.values()]
        return max(windows) + 2 * self.gap_s


# --------------------------------------------------------------------------- telemetry

# The one default of the simulated GPUs' directory: the agent, `slurm-aigc gpu-load` and the
# local cluster all read it from here (telemetry.simgpu.default_simgpu_dir adds the environment).
DEFAULT_SIMGPU_DIR = "/var/lib/slurm-aigc/simgpu"
# Loopback unless the site says otherwise: the metrics name nodes, jobs' GPUs and their use,
# and have no authentication (a Prometheus on another host: set agent.metrics_address).
DEFAULT_METRICS_ADDRESS = "127.0.0.1"
AGENT_BACKENDS = ("nvml", "sim")


@dataclass(frozen=True)
class AgentConfig:
    """The `agent:` section (the node agent)."""

    backend: str = "nvml"
    simgpu_dir: str = DEFAULT_SIMGPU_DIR  # an absent key: $SLURM_AIGC_SIMGPU_DIR when set
    interval_s: float = DEFAULT_AGENT_INTERVAL_S
    publish_features: bool = True
    feature_check_s: float = 1800.0  # the publisher re-adds lost static features each cycle (issue 11.5)
    metrics_port: int | None = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS


def _default_scorers() -> Mapping[str, float]:
    return {"cool_first": 1.0, "pack_keep_islands": 1.0}


@dataclass(frozen=True)
class ScoringConfig:
    """The `scoring:` section (the feature/weight publisher)."""

    interval_s: float = 30.0
    window_s: float = 300.0
    weight_min: int = 1
    weight_max: int = 100
    hysteresis: int = 5
    # `scontrol update`s one cycle may make: after `scontrol reconfigure` every node differs at
    # once, and 2,000 writes in one cycle would queue behind each other in slurmctld.
    max_writes_per_cycle: int = 200
    publish_nvfree: bool = True
    publish_models: bool = True
    serving_classes: tuple[str, ...] = ("infer", "imagegen")
    # None: write no listing. The loader sets the hook's rewrites.model_prefer.published_features_file
    # when the key is absent (the one default of that file is the hook's).
    published_features_file: str | None = None
    model_linger_s: float = 300.0
    model_unlist_grace_s: float = 30.0
    # model_<id> features on one node at most: a running job's owner can rewrite its `model=`
    # at will, and each name would linger on the node (publish_plan.cap_sightings).
    max_models_per_node: int = 8
    policies: Mapping[str, float] = field(default_factory=_default_scorers)

    def policy_weights(self) -> Mapping[str, float]:
        """The enabled plugins and their weights."""
        return self.policies


# --------------------------------------------------------------------------- storage


@dataclass(frozen=True)
class StorageConfig:
    """The `storage:` section: how long the state database keeps what."""

    # Raw per-GPU samples older than this are rolled up and deleted; the reclaim windows
    # (reclaim.*.window_s) and `slurm-aigc report` of recent jobs need less than this.
    raw_retention_hours: float = 48.0


# --------------------------------------------------------------------------- learned defaults

DEFAULT_LEARNED_FILE = "/var/lib/slurm-aigc/learned-defaults.txt"


@dataclass(frozen=True)
class LearnedConfig:
    """The `learned:` section: defaults for untagged jobs learned from their owners' history.

    Opt-in: the controller learns per (user, job-name pattern) and writes `file`, which the hook
    reads (slurm_aigc/telemetry/learned.py explains every rule).
    """

    enabled: bool = False
    file: str = DEFAULT_LEARNED_FILE
    min_jobs: int = 5  # jobs behind each learned value: one or two runs are an accident
    max_age_days: float = 14.0  # older jobs say little about the next one
    max_entries: int = 10000  # the hook reads the whole file: keep it bounded
    refresh_seconds: int = 60  # the hook re-reads the file at most this often
    interval_s: float = 600.0  # the controller learns at most this often
    vram_margin_pct: float = 10.0  # added to the p95 of the peaks before rounding up to GiB
    max_vram_spread: float = 2.0  # VRAM learned only where p95 <= this x median peak: a wider key lumps sizes
    min_class_share: float = 0.8  # a class is learned only when this share of the evidence agrees


@dataclass(frozen=True)
class Policy:
    source: str
    inventory: Inventory
    classes: Mapping[str, ClassDefaults]
    detection: tuple[DetectionRule, ...]
    rewrites: Rewrites
    hook: HookSettings
    storage: StorageConfig = StorageConfig()
    reclaim: ReclaimConfig = ReclaimConfig()
    scoring: ScoringConfig = ScoringConfig()
    agent: AgentConfig = AgentConfig()
    learned: LearnedConfig = LearnedConfig()
