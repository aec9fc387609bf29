"""Optional Prometheus metrics of the daemons (`--metrics-port`), via prometheus_client.

Per GPU: the last reading (`slurm_aigc_gpu_*{node,gpu}`); per daemon: tick durations,
failed ticks and changes published. Without a port the daemons use `NullMetrics`, so
prometheus_client is imported only when metrics are asked for.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any, Protocol

from slurm_aigc.daemonloop import TickOutcome
from slurm_aigc.errors import AigcError
from slurm_aigc.policy.model import DEFAULT_METRICS_ADDRESS
from slurm_aigc.telemetry.records import NodeReading

LOG = logging.getLogger(__name__)

# (metric suffix, GpuReading attribute, help)
_GPU_GAUGES = (
    ("sm_util_pct", "sm_util_pct", "SM utilization in percent"),
    ("mem_bw_util_pct", "mem_bw_util_pct", "memory-bandwidth utilization in percent"),
    ("memory_used_mib", "memory_used_mib", "memory used in MiB"),
    ("memory_total_mib", "memory_total_mib", "memory total in MiB"),
    ("power_draw_w", "power_draw_w", "power draw in W"),
    ("power_limit_w", "power_limit_w", "enforced power limit in W"),
    ("temperature_c", "temperature_c", "temperature in degrees C"),
)


class MetricsError(AigcError):
    """Metrics were asked for but cannot be served (no prometheus_client, port in use)."""


class DaemonMetrics(Protocol):
    def observe_reading(self, reading: NodeReading) -> None: ...
    def observe_tick(self, outcome: TickOutcome) -> None: ...
    def count_publication(self, node: str) -> None: ...


class NullMetrics:
    """Metrics off: every observation is dropped."""

    def observe_reading(self, reading: NodeReading) -> None:
        """Nothing to do."""

    def observe_tick(self, outcome: TickOutcome) -> None:
        """Nothing to do."""

    def count_publication(self, node: str) -> None:
        """Nothing to do."""


class PrometheusMetrics:
    """The metrics in their own registry (tests read it; `serve` exposes it over HTTP)."""

    def __init__(self, daemon: str) -> None:
        try:
            import prometheus_client as prom
        except ImportError as error:
            raise MetricsError("metrics need prometheus_client: pip install prometheus-client") from error
        self._prom: Any = prom
        self.registry = prom.CollectorRegistry()
        labels = ["node", "gpu"]
        self._gauges = {
            attr: prom.Gauge(f"slurm_aigc_gpu_{name}", f"GPU {text}", labels, registry=self.registry)
            for name, attr, text in _GPU_GAUGES
        }
        self._lost = prom.Gauge("slurm_aigc_gpu_lost", "1 when the GPU failed in the last poll", labels,
                                registry=self.registry)
        self._processes = prom.Gauge("slurm_aigc_gpu_processes", "compute processes on the GPU", labels,
                                     registry=self.registry)
        self._tick = prom.Histogram("slurm_aigc_tick_seconds", "duration of one daemon tick", ["daemon"],
                                    registry=self.registry)
        self._errors = prom.Counter("slurm_aigc_tick_errors", "ticks that raised", ["daemon"], registry=self.registry)
        self._published = prom.Counter("slurm_aigc_publications", "feature/weight changes written to Slurm",
                                       ["node"], registry=self.registry)
        self._daemon = daemon

    def serve(self, port: int, address: str = DEFAULT_METRICS_ADDRESS) -> None:
        """Expose /metrics on `address`:`port` (a background thread of prometheus_client).

        prometheus_client's own default address is every interface; ours is loopback.
        """
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise MetricsError(f"metrics address must be an IP address (127.0.0.1, ::1, 0.0.0.0), got {address!r}") from None
        try:
            self._prom.start_http_server(port, addr=address, registry=self.registry)
        except OSError as error:
            raise MetricsError(f"cannot serve metrics on {address} port {port}: {error}") from error
        LOG.info("metrics on http://%s:%d/metrics", address, port)

    def observe_reading(self, reading: NodeReading) -> None:
        """Set the per-GPU gauges from one poll; a field not available is left out."""
        for gpu in reading.gpus:
            labels = (reading.node, str(gpu.index))
            self._lost.labels(*labels).set(1 if gpu.lost else 0)
            self._processes.labels(*labels).set(len(gpu.processes))
            for attr, gauge in self._gauges.items():
                value = getattr(gpu, attr)
                if value is not None:
                    gauge.labels(*labels).set(value)
                else:
                    _drop(gauge, labels)  # "not available" is no sample, never a stale or zero one

    def observe_tick(self, outcome: TickOutcome) -> None:
        self._tick.labels(self._daemon).observe(outcome.duration_s)
        if not outcome.ok:
            self._errors.labels(self._daemon).inc()

    def count_publication(self, node: str) -> None:
        self._published.labels(node).inc()

    def value(self, name: str, labels: dict[str, str]) -> float | None:
        """A sample's current value (for tests and the benchmark)."""
        result = self.registry.get_sample_value(name, labels)
        return None if result is None else float(result)


def _drop(gauge: Any, labels: tuple[str, ...]) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass


def open_metrics(daemon: str, port: int | None, address: str | None = None) -> DaemonMetrics:
    """Serving Prometheus metrics on `address` (None: loopback) and `port`, or NullMetrics without a port."""
    if port is None:
        return NullMetrics()
    metrics = PrometheusMetrics(daemon)
    metrics.serve(port, address or DEFAULT_METRICS_ADDRESS)
    return metrics
