"""Benchmark: the publisher's mean SM per node over a full window, with each schema's gpu_samples indexes.

    .venv/bin/python benchmarks/bench_publisher_mean.py [--nodes 1000] [--db-url URL]

Every publisher cycle (`scoring.interval_s`) the controller asks the database for each node's
mean SM over the last `scoring.window_s` (`TelemetryStore.mean_util_by_node`). This fills
`gpu_samples` with `--nodes` nodes of 8 GPUs polled every 10 s for 570 s (the last 300 s are the
window, 240,000 rows at 1,000 nodes), then times that query (median of 7, after one warm-up)
with the version-3 covering index, with the version-2 indexes (ts, node) it replaced, and
again after running the version-3 migration step on the filled table, whose build time it
also prints.

Database: by default a scratch database on the local cluster's MariaDB (created with the
`test` role's credentials, dropped at the end); `--db-url sqlite:///FILE` needs no cluster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_aigc.db import (  # noqa: E402
    GPU_SAMPLES_COVERING_INDEX,
    GpuSample,
    _v3_gpu_samples_covering_index,
    drop_index,
    open_database,
    read_url_file,
    scratch_database,
)
from slurm_aigc.localcluster.config import TEST_DATABASE_PREFIX  # noqa: E402
from slurm_aigc.localcluster.manager import LocalCluster  # noqa: E402
from slurm_aigc.telemetry.store import TelemetryStore  # noqa: E402

GPUS_PER_NODE = 8
INTERVAL_S = 10.0
POLLS = 57  # 570 s: 270 s of older rows, then the 300 s window
WINDOW_POLLS = 30


def fill(factory: sessionmaker[Session], nodes: int) -> float:
    engine = factory.kw["bind"]
    for poll in range(POLLS):
        rows = [{"ts": 1000.0 + INTERVAL_S * poll, "node": f"gpu{n:04d}", "gpu_index": g, "lost": False,
                 "sm_util_pct": float((n + g + poll) % 100), "memory_used_mib": 1000.0, "power_draw_w": 100.0}
                for n in range(nodes) for g in range(GPUS_PER_NODE)]
        with engine.begin() as connection:
            connection.execute(insert(GpuSample), rows)
        print(f"\rfilling gpu_samples: poll {poll + 1}/{POLLS}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return 1000.0 + INTERVAL_S * (POLLS - WINDOW_POLLS)


def timed(factory: sessionmaker[Session], since: float) -> tuple[float, float]:
    engine = factory.kw["bind"]
    if engine.dialect.name in ("mysql", "mariadb"):
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE TABLE gpu_samples")  # as InnoDB's persistent statistics would be
    store = TelemetryStore(factory)
    store.mean_util_by_node(since)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        store.mean_util_by_node(since)
        times.append(time.perf_counter() - start)
    return statistics.median(times), max(times)


def to_version_2(factory: sessionmaker[Session]) -> None:
    with factory.kw["bind"].begin() as connection:
        drop_index(connection, "gpu_samples", GPU_SAMPLES_COVERING_INDEX)
        connection.exec_driver_sql("CREATE INDEX ix_gpu_samples_ts ON gpu_samples (ts)")
        connection.exec_driver_sql("CREATE INDEX ix_gpu_samples_node ON gpu_samples (node)")


def run(url: str, nodes: int) -> None:
    factory = open_database(url)
    since = fill(factory, nodes)
    rows: list[tuple[str, str, str]] = []

    def measure(label: str, before: Callable[[], object] | None = None, build: str = "") -> None:
        if before is not None:
            before()
        median, worst = timed(factory, since)
        rows.append((label, f"{median:.3f} / {worst:.3f}", build))

    measure("v3: covering (ts, node, lost, sm_util_pct)")
    measure("v2: ts + node", lambda: to_version_2(factory))
    start = time.perf_counter()
    with factory.kw["bind"].begin() as connection:
        _v3_gpu_samples_covering_index(connection)
    build = f"{time.perf_counter() - start:.1f} s"
    measure("v3 after the migration step", build=build)
    print(f"{factory.kw['bind'].dialect.name}, {nodes} nodes x {GPUS_PER_NODE} GPUs, {POLLS * nodes * GPUS_PER_NODE:,} rows, "
          f"{WINDOW_POLLS * nodes * GPUS_PER_NODE:,} in the window")
    print(f"{'indexes':44s} {'query median / max':>20s} {'migration build':>16s}")
    for label, query, built in rows:
        print(f"{label:44s} {query:>20s} {built:>16s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--db-url", default=None, help="SQLAlchemy URL (default: a scratch database on the cluster's MariaDB)")
    args = parser.parse_args()
    if args.db_url:
        run(args.db_url, args.nodes)
        return
    server = read_url_file(LocalCluster().db_url_file("test"))
    with scratch_database(server, f"{TEST_DATABASE_PREFIX}pubmean_{os.getpid()}") as url:
        run(url, args.nodes)


if __name__ == "__main__":
    main()
