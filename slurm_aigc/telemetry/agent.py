"""The node agent (`slurm-aigc agent`): poll the GPUs, attribute processes, store, publish.

One `Agent.tick()` per interval (driven by `DaemonLoop`):

1. read every GPU of the node from the backend (NVML or simulated);
2. attribute each compute process to its Slurm job (cgroup path, slurmstepd ancestry, else
   `scontrol pidinfo`, which asks the local slurmd), learn each job's GPUs from the Prolog's
   record on the node (else one slurmctld lookup per new job), and turn the reading into
   per-job per-GPU rows; in steady state a poll makes no slurmctld RPC (docs/telemetry.md);
3. store the poll (`gpu_samples`, `process_samples`, `job_gpu_samples`) in one transaction;
4. unless dry-run, publish the node's STATIC features (GPU type, memory class, NVLink island
   size; names in `features.py`) at start, whenever they change, and every
   `feature_check_s` re-check that Slurm still has them (`scontrol reconfigure` and a
   slurmctld restart forget `scontrol update`; the publisher re-asserts them in bulk in
   between), merging into the node's existing features. The GPU type names it wrote are
   recorded in its state directory (`PublishedTypes`), so it can withdraw them after a
   restart too.

On a node with GPUs in MIG mode, Slurm's GPU indices (the Prolog record, `SLURM_JOB_GPUS`,
`gres_detail`) number MIG instances, not NVML's GPUs: allocations are not read there, and a
job has rows only on whole GPUs where NVML lists its processes (MIG GPUs list none).

A Slurm outage does not stop sampling: a failed publication is logged and retried on the
next tick while samples keep being stored. Nor does a database outage stop publishing: when
the store fails, the features are still published (when due), then the tick raises the
store's error as before.

The node's Slurm name is `--node`, else the one slurm.conf gives this host (`slurm_node_name`,
read once at start); an agent that cannot tell it does not start.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_aigc.daemonloop import DaemonLoop
from slurm_aigc.errors import AigcError
from slurm_aigc.fsio import atomic_write_text
from slurm_aigc.policy.site import load_site_policy
from slurm_aigc.slurm import SCONTROL_JSON_SINCE, SlurmCli
from slurm_aigc.telemetry import features as feat
from slurm_aigc.telemetry.config import AgentConfig
from slurm_aigc.telemetry.gres import job_gpu_indices
from slurm_aigc.telemetry.metrics import DaemonMetrics, NullMetrics, open_metrics
from slurm_aigc.telemetry.records import GpuBackend, NodeReading
from slurm_aigc.telemetry.store import JobGpuUse, TelemetryStore

LOG = logging.getLogger(__name__)

# pids of a reading -> job id per pid (None: not in a Slurm job).
PidAttributor = Callable[[Sequence[int]], Mapping[int, "str | None"]]
# A reading, the pid -> job map and job -> allocated GPU indices -> a job's use of each GPU.
UseSplitter = Callable[[NodeReading, Mapping[int, "str | None"], "Mapping[str, Sequence[int]] | None"], Sequence[JobGpuUse]]
# The pid -> job map of this poll -> the GPU indices Slurm gave each job on this node.
AllocationSource = Callable[[Mapping[int, "str | None"]], "Mapping[str, Sequence[int]]"]
# Topology text -> NVLink islands (raises AigcError when the text is not a topo -m matrix).
IslandParser = Callable[[str], list[list[int]]]


class NodeNameError(AigcError):
    """This host's Slurm NodeName is not known for sure: the agent does not start on a guess."""


_SET_NODE_HINT = ("--node NAME, NAME being the host's NodeName in slurm.conf (systemd: `systemctl edit slurm-aigc-agent`, "
                  "then `ExecStart=` and `ExecStart=/usr/local/bin/slurm-aigc agent --node NAME`)")


def slurm_node_name(slurm: SlurmCli, hostname: Callable[[], str] | None = None) -> str:
    """This host's Slurm NodeName, found the way slurmd finds its own when not given `-N`.

    `scontrol show aliases` prints the NodeNames slurm.conf gives this host (NodeHostname, looked
    up by the short host name, then as slurmd does); scontrol reads slurm.conf itself, no slurmctld
    RPC (sdiag on 22.05.8). `NodeName=gpu001 NodeHostname=r3n17` gives gpu001 on r3n17, which
    `hostname -s` would have missed: samples under a name that is not a node are dropped by the
    controller as foreign, the Prolog's records (keyed by SLURMD_NODENAME) are never found and
    feature updates fail. A host named in no slurm.conf (a dynamic node, `slurmd -Z`) goes by
    its short name once one node read confirms that slurmctld has it. Several nodes, or none,
    raise NodeNameError: guessing would break all three quietly. `hostname` (default: what
    `hostname` prints) serves the full-name and dynamic-node steps and the errors; scontrol's
    own lookup asks the system itself.
    """
    full = (hostname or socket.gethostname)()
    short = full.split(".", 1)[0]
    names = _aliases(slurm, None, full) or (_aliases(slurm, full, full) if full != short else [])
    if len(names) > 1:
        raise NodeNameError(f"host {full} runs several Slurm nodes ({' '.join(names)}): run one agent per node, "
                            f"each started with {_SET_NODE_HINT}")
    if names:
        LOG.info("agent: host %s is Slurm node %s (slurm.conf)", full, names[0])
        return names[0]
    try:
        slurm.node(short)  # one node read, only where slurm.conf names no node for this host
    except AigcError as error:
        raise NodeNameError(f"no Slurm node for host {full}: no NodeHostname={short} in slurm.conf and no node {short} "
                            f"in slurmctld ({error}); start the agent with {_SET_NODE_HINT}") from error
    return short


def _aliases(slurm: SlurmCli, host: str | None, full: str) -> list[str]:
    """`scontrol show aliases [HOST]`: the NodeNames of HOST (this host when None) in slurm.conf."""
    try:
        return slurm.run("scontrol", ["show", "aliases", *([host] if host else [])]).stdout.split()
    except AigcError as error:
        raise NodeNameError(f"cannot read the Slurm node of host {full} from slurm.conf ({error}); "
                            f"start the agent with {_SET_NODE_HINT}") from error


def gpu_types(reading: NodeReading) -> frozenset[str]:
    """The GPU type features of the node's whole GPUs that were read (not those in MIG mode)."""
    names = {feat.gpu_type_feature(gpu.name) for gpu in reading.gpus if not gpu.lost and not gpu.mig}
    return frozenset(name for name in names if name)


def static_features(reading: NodeReading, islands: Sequence[Sequence[int]] | None) -> tuple[str, ...]:
    """The agent's features for a node: GPU type(s), memory class(es), NVLink island size, `mig`.

    A GPU in MIG mode gives only `mig` (module docstring of `features.py`).
    """
    whole = [gpu for gpu in reading.gpus if not gpu.lost and not gpu.mig]
    classes = {feat.memory_class_feature(gpu.memory_total_mib) for gpu in whole}
    found = set(gpu_types(reading)) | {name for name in classes if name}
    if any(gpu.mig and not gpu.lost for gpu in reading.gpus):
        found.add(feat.MIG_FEATURE)
    if islands:
        # What the publisher will read back from `nvlink<N>` must be true (features.consecutive_islands).
        mig = {gpu.index for gpu in reading.gpus if gpu.mig}
        found.update(feat.nvlink_features(feat.consecutive_islands(islands, len(reading.gpus), mig)))
    return tuple(sorted(found))


def _judged(reading: NodeReading, islands: Sequence[Sequence[int]] | None,
            published_types: frozenset[str] = frozenset()) -> Callable[[str], bool]:
    """Which of our static features this reading can judge. Without a topology (`topo -m` failed
    at start) the nvlink features are unknown, not gone; with a GPU lost, so are the type and
    memory classes (the lost GPU's may be the only one of its kind). Unknown ones are kept."""
    lost = any(gpu.lost for gpu in reading.gpus)

    def judged(feature: str) -> bool:
        if not feat.is_static_feature(feature, published_types):
            return False
        nvlink = feat.is_nvlink_feature(feature)
        return (islands is not None) if nvlink else not lost
    return judged


_SAFE_NAME_RE = re.compile(r"[^A-Za-z0-9_.-]")
_TYPE_NAME_RE = re.compile(r"^[a-z0-9]+$")  # what `features.gpu_type_feature` makes


class PublishedTypes:
    """The GPU type features this node's agent has written to Slurm, kept across restarts.

    `<state_dir>/published-types.<node>.json` (`{"type_features": [...]}`) in the agent's own
    state directory; `state_dir` None keeps them in memory only. An unreadable or malformed
    file counts as empty (what is unknown is never withdrawn) and is logged.
    """

    def __init__(self, state_dir: Path | None, node: str) -> None:
        self._path = None if state_dir is None else state_dir / f"published-types.{_SAFE_NAME_RE.sub('_', node)}.json"
        self.names = self._load()

    def keep(self, names: Iterable[str]) -> None:
        """Record exactly `names` (written only when they change)."""
        wanted = frozenset(names)
        if wanted == self.names:
            return
        self.names = wanted
        if self._path is None:
            return
        try:
            atomic_write_text(self._path, json.dumps({"type_features": sorted(wanted)}) + "\n", mode=0o600, durable=True)
        except OSError as error:
            LOG.warning("agent: cannot record published GPU types in %s (%s); a restarted agent will not "
                        "withdraw those outside the known list", self._path, error)

    def _load(self) -> frozenset[str]:
        if self._path is None:
            return frozenset()
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
            names = data["type_features"]
            if not isinstance(names, list):
                raise TypeError("type_features is not a list")
        except FileNotFoundError:
            return frozenset()
        except (OSError, ValueError, KeyError, TypeError) as error:
            LOG.warning("agent: ignoring %s (%s): GPU types it recorded are not withdrawn", self._path, error)
            return frozenset()
        return frozenset(n for n in names if isinstance(n, str) and _TYPE_NAME_RE.match(n))


def state_dir_from_env() -> Path | None:
    """systemd's `$STATE_DIRECTORY` (the unit's `StateDirectory=`; the first of a `:` list), or None."""
    value = os.environ.get("STATE_DIRECTORY", "").split(":", 1)[0]
    return Path(value) if value else None


@dataclass(frozen=True)
class PollResult:
    """What one tick did (tests and `--once` output)."""

    node: str
    gpus: int
    lost: int
    processes: int
    rows_written: int
    published: tuple[str, ...] | None


class Agent:
    """One node's agent; every side effect is a constructor argument."""

    def __init__(
        self,
        node: str,
        backend: GpuBackend,
        store: TelemetryStore | None,
        slurm: SlurmCli,
        config: AgentConfig,
        *,
        attribute: PidAttributor,
        split_uses: UseSplitter,
        parse_islands: IslandParser,
        allocations: AllocationSource | None = None,
        dry_run: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        metrics: DaemonMetrics | None = None,
        published_types: PublishedTypes | None = None,
    ) -> None:
        self.node = node
        self._backend = backend
        self._store = store
        self._slurm = slurm
        self.config = config
        self._attribute = attribute
        self._split_uses = split_uses
        self._allocations = allocations
        self._dry_run = dry_run
        self._clock = clock
        self._wall_clock = wall_clock
        self._metrics = metrics or NullMetrics()
        self._islands = self._read_islands(parse_islands)
        self._published: tuple[str, ...] | None = None
        self._last_check: float | None = None
        self._types = published_types or PublishedTypes(None, node)
        self._mig_noted = False

    def set_config(self, config: AgentConfig) -> None:
        """Take a reloaded config (SIGHUP); the backend stays what the agent started with."""
        if config.backend != self.config.backend or config.simgpu_dir != self.config.simgpu_dir:
            LOG.warning("agent: a new GPU backend takes a restart; keeping %s", self.config.backend)
        self.config = config
        self._last_check = None  # re-check Slurm's features under the new settings

    def tick(self) -> PollResult:
        """One poll: read, attribute, store, publish; a failed store still publishes, then raises."""
        reading = self._backend.read()
        pids = sorted({proc.pid for gpu in reading.gpus for proc in gpu.processes})
        pid_jobs = self._attribute(pids) if pids else {}
        uses = self._split_uses(reading, pid_jobs, self._allocations_for(reading, pid_jobs))
        try:
            # Samples first: a slow slurmctld must not hold them back.
            written = self._store.write_poll(reading, pid_jobs, uses) if self._store is not None else 0
        except Exception:
            # A database outage must not keep the static features out of Slurm too: after a
            # reconfigure during it, `--constraint=a100` jobs would pend for its whole length.
            # The tick still fails, so the loop logs the store's error and backs off as before.
            self._publish_if_on(reading)
            raise
        self._metrics.observe_reading(reading)
        published = self._publish_if_on(reading)
        result = PollResult(
            node=self.node, gpus=len(reading.gpus), lost=sum(1 for g in reading.gpus if g.lost),
            processes=len(pids), rows_written=written, published=published,
        )
        LOG.debug("agent: %s", result)
        return result

    def close(self) -> None:
        self._backend.close()

    def _allocations_for(self, reading: NodeReading, pid_jobs: Mapping[int, str | None]
                         ) -> Mapping[str, Sequence[int]] | None:
        """Allocations, except on a node with MIG GPUs, where Slurm's indices are not NVML's."""
        if not any(gpu.mig for gpu in reading.gpus):
            return self._read_allocations(pid_jobs)
        if not self._mig_noted:
            self._mig_noted = True
            LOG.warning("agent: %s has GPUs in MIG mode: Slurm's GPU indices there number MIG instances, not "
                        "NVML's GPUs, so allocations are not read; jobs show only where NVML lists their "
                        "processes on whole GPUs", self.node)
        return None

    def _read_allocations(self, pid_jobs: Mapping[int, str | None]) -> Mapping[str, Sequence[int]] | None:
        """Which GPUs each job holds, so a job idling on an allocated GPU shows as a zero row."""
        if self._allocations is None:
            return None
        try:
            return self._allocations(pid_jobs)
        except AigcError as error:
            LOG.warning("agent: cannot read GPU allocations (rows only for GPUs in use): %s", error)
            return None

    # -- static features

    def _read_islands(self, parse: IslandParser) -> list[list[int]] | None:
        """NVLink islands from `nvidia-smi topo -m`, once at start; None when unknown."""
        try:
            text = self._backend.topology_text()
            return parse(text) if text else None
        except (AigcError, OSError) as error:
            LOG.warning("agent: no NVLink topology (%s); not publishing nvlink features", error)
            return None

    def _publish_if_on(self, reading: NodeReading) -> tuple[str, ...] | None:
        return self._publish(reading) if self.config.publish_features else None

    def _publish(self, reading: NodeReading) -> tuple[str, ...] | None:
        """Publish the static features when due; returns the features written, if any."""
        wanted = static_features(reading, self._islands)
        if not wanted or not self._due(wanted):
            return None
        try:
            return self._publish_now(wanted, _judged(reading, self._islands, self._types.names), gpu_types(reading))
        except AigcError as error:
            LOG.warning("agent: cannot publish features of %s (retrying next tick): %s", self.node, error)
            return None

    def _due(self, wanted: tuple[str, ...]) -> bool:
        if wanted != self._published:
            return True
        if self._dry_run:
            return False  # a dry run logs each would-be change once
        return self._last_check is None or self._clock() - self._last_check >= self.config.feature_check_s

    def _publish_now(self, wanted: tuple[str, ...], judged: Callable[[str], bool] = feat.is_static_feature,
                     types: frozenset[str] = frozenset()) -> tuple[str, ...] | None:
        """`scontrol show node` then, when ours are missing or stale, `scontrol update NodeName=.. Features=..`.

        Only features this reading can judge (`judged`) are replaced; the others stay as Slurm has them.
        `types` (the GPU types among `wanted`) are recorded before the update and kept after it as
        long as Slurm has them.
        """
        listed = self._slurm.node(self.node)
        current = listed.available_features
        self._last_check = self._clock()
        merged = feat.merge_features(current, wanted, judged)
        if feat.same_features(merged, current):
            self._published = wanted
            self._record_types(merged, types)
            return None
        reason = "static features " + " ".join(f"+{f}" for f in sorted(set(merged) - set(current)))
        removed = sorted(set(current) - set(merged))
        reason += "".join(f" -{f}" for f in removed)
        if self._dry_run:
            LOG.info("dry-run: would update %s: %s", self.node, reason)
        else:
            self._types.keep(self._types.names | types)  # first: a crash after the update must not orphan a name
            self._slurm.update_node(self.node, features=merged, current=listed)  # keeps a features plugin's active ones
            LOG.info("agent: updated %s: %s", self.node, reason)
            self._metrics.count_publication(self.node)
            self._record_types(merged, types)
        # Not recorded in node_publications: the agent's database role (its credentials sit on every
        # compute node) may only add samples, so the log line and the metric are this change's record.
        self._published = wanted
        return merged

    def _record_types(self, merged: Sequence[str], types: frozenset[str]) -> None:
        """Keep recorded the type names Slurm now has by our hand; a dry run records nothing."""
        if not self._dry_run:
            self._types.keep(f for f in merged if f in types or f in self._types.names)


def looks_up_unlisted(slurm: SlurmCli) -> bool:
    """Whether the agent asks slurmctld for a job whose Prolog record lists no GPUs (JobAllocations).

    Slurm 24.11's Prolog gets neither SLURM_JOB_GPUS nor CUDA_VISIBLE_DEVICES once slurmctld has
    run `scontrol reconfigure` (measured on 24.11.5, for gpu and shard jobs), so there a job
    holding an idle GPU leaves a record without GPUs; from 23.02 the lookup is one single-job RPC.
    22.05's Prolog lists a GPU job's GPUs, also after a reconfigure (the agent daemon integration
    test), and its lookup lists every job: there a record without GPUs is a job without GPUs.
    """
    try:
        return slurm.version() >= SCONTROL_JSON_SINCE
    except AigcError as error:
        LOG.warning("agent: no Slurm version (%s); asking slurmctld for jobs whose record lists no GPUs", error)
        return True


def slurm_allocation_lookup(slurm: SlurmCli, node: str) -> Callable[[str], frozenset[int]]:
    """`SlurmCli.job(ID)` (JSON) -> the GPU indices of job ID on `node` (one slurmctld RPC)."""
    def lookup(job_id: str) -> frozenset[int]:
        job = slurm.job(job_id)
        return job_gpu_indices(job, node) if job is not None else frozenset()

    return lookup


# --------------------------------------------------------------------------- wiring


@dataclass(frozen=True)
class AgentOptions:
    """`slurm-aigc agent` options; None means "from the config file"."""

    config_path: str | None = None
    node: str | None = None
    backend: str | None = None
    simgpu_dir: str | None = None
    db_url: str | None = None
    interval_s: float | None = None
    metrics_port: int | None = None
    dry_run: bool = False


def effective_config(options: AgentOptions) -> AgentConfig:
    """The config file's `agent:` section with the command-line options laid over it."""
    config = load_site_policy(options.config_path, hook_sections=False).agent
    return replace(
        config,
        backend=options.backend or config.backend,
        simgpu_dir=options.simgpu_dir or config.simgpu_dir,
        interval_s=options.interval_s or config.interval_s,
        metrics_port=options.metrics_port if options.metrics_port is not None else config.metrics_port,
    )


def build_agent(options: AgentOptions, config: AgentConfig, metrics: DaemonMetrics) -> Agent:
    """The production agent: real backend, database, Slurm tools, /proc attribution."""
    from slurm_aigc.db import open_database
    from slurm_aigc.telemetry.attribution import Attributor, JobAllocations, job_gpu_usage
    from slurm_aigc.telemetry.backends import open_backend
    from slurm_aigc.telemetry.procfs import JobRecordDir, ProcFs
    from slurm_aigc.telemetry.topology import parse_topo_matrix

    slurm = SlurmCli()
    node = options.node or slurm_node_name(slurm)  # --node as given: the local cluster's nodes share a host
    backend = open_backend("sim" if config.backend == "sim" else "nvml", node, Path(config.simgpu_dir))
    store = None if options.dry_run else TelemetryStore(open_database(options.db_url))
    proc = ProcFs()
    attributor = Attributor(slurm, proc)
    allocations = JobAllocations(node, JobRecordDir(node).read, slurm_allocation_lookup(slurm, node), proc,
                                 look_up_unlisted=looks_up_unlisted(slurm))

    return Agent(
        node, backend, store, slurm, config,
        attribute=attributor.jobs_of, split_uses=job_gpu_usage,
        parse_islands=lambda text: parse_topo_matrix(text).nvlink_islands(),
        allocations=allocations, dry_run=options.dry_run, metrics=metrics,
        published_types=PublishedTypes(state_dir_from_env(), node),
    )


def run_agent(options: AgentOptions, once: bool, report: Callable[[PollResult], None]) -> int:
    """`slurm-aigc agent`: build, then loop until SIGTERM (or one tick with `once`)."""
    config = effective_config(options)
    metrics = open_metrics("agent", config.metrics_port, config.metrics_address)
    agent = build_agent(options, config, metrics)

    def tick() -> None:
        result = agent.tick()
        if once:
            report(result)

    def reload() -> None:
        new = effective_config(options)  # raises ConfigError: the loop keeps the old config
        agent.set_config(new)
        loop.interval_s = new.interval_s

    loop = DaemonLoop(tick, config.interval_s, reload, name=f"agent {agent.node}", on_tick=metrics.observe_tick)
    try:
        return loop.run(once=once)
    finally:
        agent.close()
