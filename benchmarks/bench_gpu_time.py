"""Where each GPU-second of a `replay compare` went: per GPU type, free or held, by job class and phase.

    .venv/bin/python benchmarks/bench_gpu_time.py --out-dir DIR [--since-minutes 90] [--aigc-db URL|FILE]

Run it right after `slurm-aigc replay compare ... --out-dir DIR` on the local cluster, before
another replay: it reads each leg's samples from that leg's scratch database on the cluster's
MariaDB (`slurm_aigc_scratch_replay_stock`, `..._aigc`), the workload the legs ran
(`DIR/workload.csv`: each job's class, GPUs, VRAM and usage profile) and, from sacct (as JSON,
through the report's reader), the names of the jobs that ran in the last `--since-minutes`
(job id -> workload job; both legs submit the same names under their own ids). A compare run
with `--db` (a warm learned table) kept its slurm-aigc leg's samples there, beside earlier
runs': pass the same `--aigc-db`, and a `--since-minutes` that covers this compare (both legs) and no earlier run
into that database, since the leg starts at the first sample of a job sacct names (its first
job's sample, a few seconds after the first GPU sample, which starts the stock leg).

For every GPU sample of the judged window (the first `duration_s` of the leg, compare.json):
- free: no job held the GPU at that poll;
- else the job(s) holding it, each counted 1/n of the sample when n jobs share the GPU (a `*`
  after the class), by the phase their workload profile was in (seconds since the job's first
  sample on that GPU): loading, busy, idle, hung, or `after` (past its profile: a shrunk or
  requeued job's second run plays its own profile);
- useful: the sample's useful SM (replay.metrics' rule, as the compare's figure) over the same
  split.
A last table gives the share of each type's time held by jobs a smaller type could hold (one
GPU, VRAM at most the t4's 15 GiB): the a100 time that placement alone could move.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import text

from slurm_aigc.db import open_database
from slurm_aigc.localcluster.manager import LocalCluster
from slurm_aigc.replay.workload import Workload
from slurm_aigc.replay.workload_files import read_workload
from slurm_aigc.report.figures import DEFAULT_USEFUL_RULE
from slurm_aigc.report.sacct import JobRecord, SacctQuery, SacctReader
from slurm_aigc.slurm import SlurmCli

# A simulated t4 holds 15 GiB (simgpu); a job up to this fits one whole.
SMALL_TYPE_GIB = 15.0
MIN_SHARE = 0.005  # rows under half a percent of a type's time are left out of the table


def job_names(since_minutes: float) -> dict[str, str]:
    """Job id -> name for every job sacct knows from the last `since_minutes` (both legs), read as
    JSON by the report's reader: a job name is user text, which no delimiter can hold."""
    now = datetime.now()
    query = SacctQuery(since=now - timedelta(minutes=since_minutes), until=now)
    return {row.job_id_raw: row.name for row in SacctReader(SlurmCli()).rows(query) if isinstance(row, JobRecord)}


def phase_at(profile: tuple[tuple[str, float], ...], seconds: float) -> str:
    elapsed = 0.0
    for kind, length in profile:
        elapsed += length
        if seconds < elapsed:
            return kind
    return "after"


def leg(mode: str, workload: Workload, names: dict[str, str], window_s: float, db: str | None = None) -> None:
    factory = open_database(db or str(LocalCluster().db_url_file(f"scratch-replay_{mode}")), create=False)
    with factory() as session:
        gpus = session.execute(text("SELECT ts, node, gpu_index, sm_util_pct, power_draw_w, power_limit_w "
                                    "FROM gpu_samples")).all()
        held = session.execute(text("SELECT ts, node, gpu_index, job_id FROM job_gpu_samples")).all()
    if not gpus:
        print(f"{mode}: no samples in its scratch database", file=sys.stderr)
        return
    start = min(row[0] for row in gpus)
    if db is not None:  # a kept database holds earlier runs too: this leg starts with its first job's sample
        start = min((ts for ts, _node, _index, job_id in held if job_id.split("_")[0] in names), default=start)
    jobs = {job.name: job for job in workload.jobs}
    first: dict[tuple[str, str, int], float] = {}
    on: dict[tuple[str, int, int], list[str]] = collections.defaultdict(list)
    for ts, node, index, job_id in held:
        key = (job_id, node, index)
        first[key] = min(first.get(key, ts), ts)
        on[(node, index, round(ts))].append(job_id)
    time_by: dict[tuple[str, str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    totals: collections.Counter[str] = collections.Counter()
    movable: dict[str, float] = collections.defaultdict(float)
    for ts, node, index, util, power, limit in gpus:
        if not 0 <= ts - start <= window_s:
            continue
        kind = node.rsplit("-", 1)[0]
        totals[kind] += 1
        useful = (DEFAULT_USEFUL_RULE.useful_pct(util or 0.0, power, limit) or 0.0) / 100
        holders = on.get((node, index, round(ts)), [])
        if not holders:
            row = time_by[(kind, "-", "free")]
            row[0] += 1
            row[1] += useful
            continue
        for job_id in holders:
            job = jobs.get(names.get(job_id.split("_")[0], ""))
            cls = (job.job_class if job else "?") + ("*" if len(holders) > 1 else "")
            phase = phase_at(tuple((p.kind, p.seconds) for p in job.profile), ts - first[(job_id, node, index)]) \
                if job else "?"
            row = time_by[(kind, cls, phase)]
            row[0] += 1 / len(holders)
            row[1] += useful / len(holders)
            if job and job.gpus == 1 and job.vram_gib_per_gpu <= SMALL_TYPE_GIB:
                movable[f"{kind} {job.job_class}"] += 1 / len(holders)
    print(f"\n{mode}: share of each GPU type's samples over the first {window_s:g} s")
    print(f"{'type':5s} {'class':10s} {'phase':8s} {'time':>7s} {'useful':>7s}")
    for (kind, cls, phase), (count, useful) in sorted(time_by.items()):
        if count / totals[kind] >= MIN_SHARE:
            print(f"{kind:5s} {cls:10s} {phase:8s} {count / totals[kind]:7.1%} {useful / totals[kind]:7.1%}")
    for kind in sorted(totals):
        free = time_by[(kind, "-", "free")][0]
        useful_all = sum((u for (k, _c, _p), (_n, u) in time_by.items() if k == kind), 0.0)
        print(f"{kind:5s} {'all':10s} {'':8s} {1 - free / totals[kind]:7.1%} {useful_all / totals[kind]:7.1%}  (held)")
    print(f"held by one-GPU jobs of <= {SMALL_TYPE_GIB:g} GiB: "
          + ", ".join(f"{key} {count / totals[key.split()[0]]:.1%}" for key, count in sorted(movable.items())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, required=True, help="the `replay compare` output folder")
    parser.add_argument("--since-minutes", type=float, default=None,
                        help="sacct window holding both legs (default 90; with --aigc-db required: this compare only)")
    parser.add_argument("--aigc-db", default=None, metavar="URL|FILE",
                        help="the slurm-aigc leg's database when the compare was given --db (default: its scratch one)")
    args = parser.parse_args(argv)
    if args.aigc_db and args.since_minutes is None:
        # The kept database holds earlier runs too; the leg starts at the first job sacct names.
        parser.error("--aigc-db needs --since-minutes covering this compare and no earlier run into that database")
    args.since_minutes = 90.0 if args.since_minutes is None else args.since_minutes
    compare = json.loads((args.out_dir / "compare.json").read_text())
    workload = read_workload(args.out_dir / "workload.csv")
    names = job_names(args.since_minutes)
    for mode in ("stock", "aigc"):
        leg(mode, workload, names, float(compare[mode]["duration_s"]), args.aigc_db if mode == "aigc" else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
