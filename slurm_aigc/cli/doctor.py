"""`slurm-aigc doctor`: is this host ready to run its part of slurm-aigc? Says what to fix.

Run on a compute node (`--role agent`) or the controller host (`--role controller`). Each
check gives one line: the database (reachable, schema, what the role can and cannot write),
Slurm (slurmctld answers, rights to update nodes and jobs), NVML (agent), the policy, the
Prolog piece (agent), the clock against the database server, and (controller) whether this
Slurm has the 22.05 shard defect. Exit 1 when any check fails.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import click

from slurm_aigc.errors import AigcError

MAX_SKEW_S = 2.0  # idle windows are minutes, but samples and actions are ordered by these clocks
# The job record script's name: in our script itself (a link to it reads the same) and in a
# site wrapper that calls it.
JOB_RECORD_MARK = "slurm-aigc-jobrecord"

# What each role must and must not be able to do (docs/deploy.md, "Database roles").
EXPECTED: dict[str, dict[str, bool]] = {
    "agent": {"add samples": True, "write actions": False, "write publications": False,
              "update rows": False, "delete samples": False},
    "controller": {"add samples": True, "read samples": True, "write actions": True,
                   "write publications": True, "update rows": True, "delete samples": True},
}


@dataclass(frozen=True)
class Finding:
    """One check's verdict: `fix` says what to do when it failed."""

    check: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class DoctorEnv:
    """What the checks touch, as functions, so tests hand in fakes."""

    open_db: Callable[[str | None], object]
    privileges: Callable[[object], dict[str, bool]]
    server_time: Callable[[object], float | None]
    slurm_config: Callable[[], dict[str, str]]
    slurm_ping: Callable[[], bool]
    slurm_admin_level: Callable[[], str]
    nvml_gpus: Callable[[], int]
    load_policy: Callable[[str | None], object]
    read_text: Callable[[str], str]
    # slurm.conf's Prolog= and Epilog= may be a glob (e.g. /etc/slurm/prolog.d/*): the files it names.
    expand: Callable[[str], list[str]] = lambda pattern: sorted(glob.glob(pattern))
    clock: Callable[[], float] = time.time
    euid: Callable[[], int] = os.geteuid


def check_database(env: DoctorEnv, role: str, db_url: str | None) -> list[Finding]:
    try:
        factory = env.open_db(db_url)
    except AigcError as error:
        return [Finding("database", False, str(error), "check the URL file (docs/deploy.md, step 1) and the server")]
    findings = [Finding("database", True, "reachable, schema current")]
    can = env.privileges(factory)
    wrong = [name for name, wanted in EXPECTED[role].items() if can.get(name) != wanted]
    summary = ", ".join(f"{'can' if can[name] else 'cannot'} {name}" for name in can)
    if wrong:
        fix = (f"grant the {role} role exactly what docs/deploy.md lists (wrong: "
               + ", ".join(f"{name} should be {'allowed' if EXPECTED[role][name] else 'refused'}" for name in wrong) + ")")
        findings.append(Finding(f"database role ({role})", False, summary, fix))
    else:
        findings.append(Finding(f"database role ({role})", True, summary))
    findings.append(_skew(env, factory))
    return findings


def _skew(env: DoctorEnv, factory: object) -> Finding:
    before = env.clock()
    server = env.server_time(factory)
    if server is None:
        return Finding("clock", True, "SQLite: no database server to compare with")
    skew = server - (before + env.clock()) / 2
    if abs(skew) > MAX_SKEW_S:
        return Finding("clock", False, f"this host is {skew:+.1f} s off the database server",
                       "run chrony/ntpd on every host (`chronyc tracking`)")
    return Finding("clock", True, f"{skew:+.2f} s from the database server")


def check_slurm(env: DoctorEnv, role: str) -> list[Finding]:
    try:
        if not env.slurm_ping():
            return [Finding("slurm", False, "slurmctld does not answer `scontrol ping`", "check SLURM_CONF and munge")]
        config = env.slurm_config()
    except AigcError as error:
        return [Finding("slurm", False, str(error), "install the Slurm client and munge on this host")]
    findings = [Finding("slurm", True, f"slurmctld answers ({config.get('SLURM_VERSION', '?')})")]
    # Both update Slurm: the controller jobs and node weights, the agent its node's static features.
    level = "root" if env.euid() == 0 else env.slurm_admin_level()
    allowed = level in ("root", "Operator", "Administrator")
    findings.append(Finding("slurm rights", allowed, f"runs as {level or 'a plain user'}",
                            "" if allowed else "run the daemon as root, or "
                            "`sacctmgr modify user NAME set adminlevel=Operator`"))
    if role == "agent":
        findings.append(_prolog(env, config))
    else:
        findings.append(_accounted_gres(config))
        if (defect := _shard_defect(config)) is not None:
            findings.append(defect)
    return findings


def _accounted_gres(config: dict[str, str]) -> Finding:
    """`report`, `replay --from-sacct` and the learner count a job's GPUs from what slurmdbd
    recorded it was allocated, and slurmdbd records a GRES only when AccountingStorageTRES names
    it: Slurm's default names none, so every job reads as a CPU job and nothing says why."""
    tracked = {name.strip() for name in config.get("AccountingStorageTRES", "").split(",")}
    types = {name.strip() for name in config.get("GresTypes", "").split(",")}
    wanted = ["gres/gpu"] + (["gres/shard"] if "shard" in types else [])
    # Typed entries alone (`gres/gpu:a100,gres/gpu:t4`) record those jobs too (slurm.conf(5)),
    # and the readers add typed counts up where the total is missing (report/tres.py).
    missing = [name for name in wanted if not any(t == name or t.startswith(name + ":") for t in tracked)]
    if not missing:
        return Finding("gpu accounting", True, f"slurmdbd records {' and '.join(wanted)} allocations")
    return Finding("gpu accounting", False,
                   f"AccountingStorageTRES does not name {', '.join(missing)}: slurmdbd records no such allocation, "
                   "so reports, replays of the site's history and learned defaults see no GPU job",
                   f"add {','.join(missing)} to AccountingStorageTRES in slurm.conf and restart slurmctld "
                   "(jobs that ended before keep no GPU record)")


def _shard_defect(config: dict[str, str]) -> Finding | None:
    """Slurm 22.05 with gres/shard: the defect the controller's `gpu_conflict` verdict deals with."""
    version = config.get("SLURM_VERSION", "")
    types = {name.strip() for name in config.get("GresTypes", "").split(",")}
    if not version.startswith("22.05.") or "shard" not in types:
        return None
    return Finding("gpu sharing", True, f"Slurm {version} can give a GPU whole while a shard job still runs on it; "
                   "the controller requeues the shard job once the two fill reclaim.gpu_conflict_memory_pct of the "
                   "GPU's memory, or at once when the other job asked share=no (docs/reclaim.md, GPU conflicts), "
                   "and separate nodes for shard jobs avoid it")


def _prolog(env: DoctorEnv, config: dict[str, str]) -> Finding:
    """Both ends of the job record: the Prolog writes it, the Epilog removes it (a record never
    removed keeps an ended job's GPUs attributed to it)."""
    found = {key: _calling(env, config.get(key, "")) for key in ("Prolog", "Epilog")}
    missing = [key for key, path in found.items() if path is None]
    if not missing:
        return Finding("prolog", True, f"{found['Prolog']} and {found['Epilog']} record job GPUs for slurm-aigc")
    said = ", ".join(f"{key}={config.get(key) or '(null)'}" for key in missing)
    return Finding("prolog", False, f"{said}: no script there calls {JOB_RECORD_MARK}",
                   "add the Prolog and Epilog lines of docs/deploy.md (step 6) to slurm.conf and "
                   "`scontrol reconfigure`")


def _calling(env: DoctorEnv, pattern: str) -> str | None:
    """The first file `pattern` names that calls the job record script, else None."""
    if not pattern or pattern == "(null)":
        return None
    for path in env.expand(pattern):
        try:
            if JOB_RECORD_MARK in env.read_text(path):
                return path
        except (OSError, UnicodeDecodeError):
            continue  # a binary or unreadable Prolog of the site's own: not ours
    return None


def check_nvml(env: DoctorEnv) -> Finding:
    try:
        count = env.nvml_gpus()
    except AigcError as error:
        return Finding("nvml", False, str(error), "install the NVIDIA driver (libnvidia-ml) on this node")
    return Finding("nvml", count > 0, f"{count} GPUs", "" if count else "no GPU visible to NVML")


def check_policy(env: DoctorEnv, config_path: str | None) -> Finding:
    try:
        policy = env.load_policy(config_path)
    except AigcError as error:
        return Finding("policy", False, str(error), "fix the file (`slurm-aigc policy check`)")
    return Finding("policy", True, f"{getattr(policy, 'source', config_path)} valid")


def run_checks(env: DoctorEnv, role: str, db_url: str | None, config_path: str | None) -> list[Finding]:
    findings = check_database(env, role, db_url) + check_slurm(env, role) + [check_policy(env, config_path)]
    if role == "agent":
        findings.append(check_nvml(env))
    return findings


def render(findings: Sequence[Finding]) -> str:
    lines = []
    for item in findings:
        lines.append(f"{'ok  ' if item.ok else 'FAIL'}  {item.check}: {item.detail}")
        if not item.ok and item.fix:
            lines.append(f"      fix: {item.fix}")
    return "\n".join(lines)


def real_env() -> DoctorEnv:
    from slurm_aigc.db import open_database, probe_privileges, server_time
    from slurm_aigc.policy.site import load_site_policy
    from slurm_aigc.slurm import SlurmCli
    from slurm_aigc.telemetry.nvml import NvmlBackend

    slurm = SlurmCli()

    def admin_level() -> str:
        user = os.environ.get("USER") or str(os.geteuid())
        out = slurm.run("sacctmgr", ["-nP", "show", "user", user, "format=adminlevel"]).stdout.strip()
        return out.splitlines()[0] if out else ""

    def nvml_gpus() -> int:
        backend = NvmlBackend(node="doctor")
        backend.start()
        try:
            return len(backend.read().gpus)
        finally:
            backend.close()

    return DoctorEnv(
        open_db=open_database, privileges=probe_privileges, server_time=server_time,  # type: ignore[arg-type]
        slurm_config=slurm.show_config, slurm_ping=slurm.ping, slurm_admin_level=admin_level,
        nvml_gpus=nvml_gpus, load_policy=load_site_policy, read_text=lambda path: open(path, encoding="utf-8").read(),
    )


@click.command()
@click.option("--role", type=click.Choice(["agent", "controller"]), required=True,
              help="What this host runs: agent (compute node) or controller.")
@click.option("--db", "db_url", default=None,
              help="Database URL or credentials file (default: $SLURM_AIGC_DB_URL, /etc/slurm-aigc/db.url).")
@click.option("--config", "config_path", default=None, help="Policy file (default: $SLURM_AIGC_CONFIG, /etc/slurm-aigc/slurm-aigc.yaml, the shipped one).")
def doctor(role: str, db_url: str | None, config_path: str | None) -> None:
    """Check this host's database role, Slurm rights, NVML, policy, Prolog and clock; say what to fix."""
    findings = run_checks(real_env(), role, db_url, config_path)
    click.echo(render(findings))
    if not all(item.ok for item in findings):
        raise SystemExit(1)
