"""Benchmark the job_submit hook: slurmctld time per submit RPC and sbatch throughput, hook vs none.

    .venv/bin/python benchmarks/bench_hook.py [--jobs 1000] [--batch 50] [--lua-only]

Needs the local cluster (root). Batches of `--batch` held jobs are submitted as aigc-alice
(root's jobs skip the hook), alternating between the rendered default hook and a
pass-through job_submit.lua, so drift in the machine affects both arms alike. Each batch
starts after the installed file's (future) mtime has passed and after one warm-up job, so
the script load is not counted. slurmctld's own cost is the `usec=` of
`_slurm_rpc_submit_batch_job` in slurmctld.log. The per-job Lua cost is measured in lupa.
At the end the default hook is installed again.
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from slurm_aigc.policy.hookruntime import HookRuntime
from slurm_aigc.policy.install import HOOK_FILE, install_hook
from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.policy.render import render_hook
from slurm_aigc.slurm import slurm_conf_dir

NOOP_LUA = """-- pass-through hook (benchmarks/bench_hook.py)
function slurm_job_submit(job_desc, part_list, submit_uid) return slurm.SUCCESS end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid) return slurm.SUCCESS end
return slurm.SUCCESS
"""
USER = "aigc-alice"
JOBS = [  # a mix: tagged shard job, tagged training job, untagged job
    ("--gres=gpu:1", "--comment=exp aigc:type=infer,model=llama3-8b,vram=20G"),
    ("--gres=gpu:4", "-N1", "--comment=aigc:type=train"),
    ("--gres=gpu:1", "--comment=just notes"),
]
USEC_RE = re.compile(r"_slurm_rpc_submit_batch_job: JobId=(\d+) .*usec=(\d+)")


def sbatch_as_user(args: Sequence[str]) -> str:
    entry = pwd.getpwnam(USER)
    argv = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups",
            "sbatch", "--parsable", "--hold", "-o", "/dev/null", "--chdir=/tmp", *args, "--wrap", "true"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    return out.strip().split(";")[0]


def install_and_settle(text: str, conf_dir: Path) -> None:
    """Install, wait until the future mtime has passed, then one warm-up submit loads it."""
    result = install_hook(text, conf_dir)
    while time.time() < result.mtime_s + 1.05:
        time.sleep(0.05)
    warm = sbatch_as_user(JOBS[0])
    subprocess.run(["scancel", warm], check=False)


def run_batch(size: int, offset: int) -> tuple[list[str], float]:
    ids: list[str] = []
    started = time.perf_counter()
    for i in range(size):
        ids.append(sbatch_as_user(JOBS[(offset + i) % len(JOBS)]))
    elapsed = time.perf_counter() - started
    subprocess.run(["scancel", *ids], check=False)
    return ids, elapsed


def usec_by_job(log: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    with open(log, errors="replace") as handle:
        for line in handle:
            match = USEC_RE.search(line)
            if match:
                found[match.group(1)] = int(match.group(2))
    return found


def lua_cost() -> list[tuple[str, float, float]]:
    hook = HookRuntime(render_hook(load_policy(shipped_policy())))
    none = HookRuntime(NOOP_LUA)
    cases: list[tuple[str, dict[str, object], int]] = [
        ("tagged infer -> shard", {"comment": "exp aigc:type=infer,model=llama3-8b,vram=20G", "tres_per_node": "gres:gpu:1"}, 1001),
        ("tagged train -> nvlink", {"comment": "aigc:type=train", "tres_per_node": "gres:gpu:4", "min_nodes": 1}, 1001),
        ("untagged, unknown", {"comment": "just notes", "tres_per_node": "gres:gpu:1", "name": "job"}, 1001),
        ("root", {"comment": "aigc:type=infer,vram=20G", "tres_per_node": "gres:gpu:1"}, 0),
    ]
    rows = []
    for name, extra, uid in cases:
        fields: dict[str, object] = {"script": "#!/bin/sh\ntrue\n", "name": "bench", **extra}
        rows.append((name, hook.seconds_per_submit(fields, submit_uid=uid), none.seconds_per_submit(fields, submit_uid=uid)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per arm")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--lua-only", action="store_true")
    args = parser.parse_args()

    print("Lua cost per slurm_job_submit call (lupa, Lua 5.1):")
    print(f"{'job':<26}{'hook us':>10}{'pass-through us':>18}{'added us':>10}")
    for name, hook_s, none_s in lua_cost():
        print(f"{name:<26}{hook_s * 1e6:>10.2f}{none_s * 1e6:>18.2f}{(hook_s - none_s) * 1e6:>10.2f}")
    if args.lua_only:
        return

    conf_dir = slurm_conf_dir()
    log = conf_dir.parent / "log" / "slurmctld.log"
    hook_text = render_hook(load_policy(shipped_policy()))
    ids: dict[str, list[str]] = {"hook": [], "none": []}
    seconds: dict[str, list[float]] = {"hook": [], "none": []}
    try:
        done = 0
        while done < args.jobs:
            size = min(args.batch, args.jobs - done)
            for arm, text in (("hook", hook_text), ("none", NOOP_LUA)) if (done // args.batch) % 2 == 0 \
                    else (("none", NOOP_LUA), ("hook", hook_text)):
                install_and_settle(text, conf_dir)
                batch_ids, batch_seconds = run_batch(size, done)
                ids[arm].extend(batch_ids)
                seconds[arm].append(batch_seconds)
            done += size
    finally:
        install_hook(hook_text, conf_dir)
    time.sleep(1.0)
    usec = usec_by_job(log)
    print(f"\nslurmctld, {args.jobs} held sbatch submissions per arm as {USER}, batches of {args.batch}, interleaved:")
    print(f"{'arm':<8}{'jobs/s':>10}{'median usec':>14}{'p90 usec':>10}{'logged':>8}")
    summary = {}
    for arm in ("hook", "none"):
        values = sorted(usec[i] for i in ids[arm] if i in usec)
        rate = len(ids[arm]) / sum(seconds[arm])
        median = statistics.median(values) if values else float("nan")
        p90 = values[int(0.9 * (len(values) - 1))] if values else float("nan")
        summary[arm] = (rate, median)
        print(f"{arm:<8}{rate:>10.1f}{median:>14.0f}{p90:>10.0f}{len(values):>8}")
    print(f"\nthroughput ratio hook/none: {summary['hook'][0] / summary['none'][0]:.3f}  (target >= 0.98)")
    print(f"median usec ratio hook/none: {summary['hook'][1] / summary['none'][1]:.3f}  (target <= 1.15)")
    print(f"installed again: {conf_dir / HOOK_FILE}")


if __name__ == "__main__":
    if os.geteuid() != 0 and "--lua-only" not in sys.argv:
        raise SystemExit("needs root (installs job_submit.lua and submits as aigc-alice)")
    main()
