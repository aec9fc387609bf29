"""`slurm-aigc doctor`: is this host ready to run its part of slurm-aigc? Says what to fix.

Run on a compute node (`--role agent`) or the controller host (`--role controller`). Each
check gives one line: the database (reachable, schema, what the role can and cannot write),
Slurm (slurmctld answers, rights to update nodes and jobs), NVML (agent), the policy, the
Prolog piece (agent), the clock against the database server, and (controller) whether this
Slurm has the 22.05 shard defect. Exit 1 when any check fails.

It checks what the role's systemd unit (daemon/slurm-aigc-<role>.service) will run with, not
the admin's shell: the database URL from the unit's EnvironmentFile= when the shell sets none,
the Slurm rights of the unit's User=.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click

from slurm_aigc import db
from slurm_aigc.errors import AigcError, DatabaseError
from slurm_aigc.shipped import AGENT_UNIT, CONTROLLER_UNIT, shipped_file

MAX_SKEW_S = 2.0  # idle windows are minutes, but samples and actions are ordered by these clocks
# The job record script's name: in our script itself (a link to it reads the same) and in a
# site wrapper that calls it.
JOB_RECORD_MARK = "slurm-aigc-jobrecord"

# What each role must and must not be able to do (docs/deploy.md, "Database roles").
EXPECTED: dict[str, dict[str, bool]] = {
    "agent": {"add samples": True, "read samples": False, "read actions": False, "write actions": False,
              "write publications": False, "update rows": False, "delete samples": False},
    "controller": {"add samples": True, "read samples": True, "read actions": True, "write actions": True,
                   "write publications": True, "update rows": True, "delete samples": True},
}
UNITS = {"agent": AGENT_UNIT, "controller": CONTROLLER_UNIT}
# The environment keys naming the database, in the order `db.default_url` reads them.
URL_KEYS = ("SLURM_AIGC_DB_URL", "SLURM_AIGC_DB_URL_FILE")


def assignments(text: str) -> dict[str, str]:
    """The KEY=VALUE lines of a systemd EnvironmentFile= (or a unit's settings), the last one of a
    key winning: `#`/`;` comment lines and quotes around a value are dropped, nothing is expanded
    or run. A line systemd would ignore as invalid (`export KEY=...`) is ignored here too."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.isidentifier():
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[key] = value
    return found


def unit_settings(role: str) -> dict[str, str]:
    """The settings of the role's shipped unit, the one place that says as whom it runs."""
    return assignments(shipped_file(UNITS[role]).read_text(encoding="utf-8"))


def unit_environment_files(role: str) -> tuple[str, ...]:
    """The unit's EnvironmentFile= paths in the order systemd reads them (a later file's keys win):
    the shared /etc/default/slurm-aigc, then the role's own, which keeps an agent's database URL
    away from a controller on the same host. The `-` only says the file may be absent."""
    text = shipped_file(UNITS[role]).read_text(encoding="utf-8")
    return tuple(line.partition("=")[2].strip().lstrip("-") for line in text.splitlines()
                 if line.partition("=")[0].strip() == "EnvironmentFile")


@dataclass(frozen=True)
class Finding:
    """One check's verdict: `fix` says what to do when it failed (or, with `warning`, when it would)."""

    check: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False  # passes, but `fix` says when it would not


@dataclass
class DoctorEnv:
    """What the checks touch, as functions, so tests hand in fakes."""

    open_db: Callable[[str | None], object]
    privileges: Callable[[object], dict[str, bool]]
    server_time: Callable[[object], float | None]
    slurm_config: Callable[[], dict[str, str]]
    slurm_ping: Callable[[], bool]
    slurm_admin_level: Callable[[str], str]  # a user's AdminLevel in slurmdbd
    nvml_gpus: Callable[[], int]
    load_policy: Callable[[str | None], object]
    read_text: Callable[[str], str]
    # slurm.conf's Prolog= and Epilog= may be a glob (e.g. /etc/slurm/prolog.d/*): the files it names.
    expand: Callable[[str], list[str]] = lambda pattern: sorted(glob.glob(pattern))
    clock: Callable[[], float] = time.time
    # Where the daemon's database URL comes from when this shell names none (`database_url`).
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    environment_files: Callable[[str], Sequence[str]] = unit_environment_files
    default_url: Callable[[], str] = db.default_url
    # The controllers' leases, each described (`lease.holders`): which process acts, which stand by.
    lease_holders: Callable[[object], Sequence[str]] = lambda factory: ()


def database_url(env: DoctorEnv, role: str, option: str | None) -> tuple[str, str]:
    """The URL the role's daemon opens, and where it came from: `--db`, else `db.default_url` over
    the daemon's environment. systemd gives the daemon its unit's EnvironmentFile=, not the
    admin's shell: that file is read unless the shell sets a key itself."""
    if option:
        return db.resolve_url(option), "--db"
    settings: Mapping[str, str] = env.environ
    where = dict.fromkeys(URL_KEYS, "the environment")
    if not any(settings.get(key) for key in URL_KEYS):
        merged: dict[str, str] = {}
        for path in env.environment_files(role):
            found = _environment_file(path)
            merged.update(found)
            where.update({key: path for key in URL_KEYS if key in found})
        settings = merged
    if settings.get("SLURM_AIGC_DB_URL"):
        return settings["SLURM_AIGC_DB_URL"], f"SLURM_AIGC_DB_URL in {where['SLURM_AIGC_DB_URL']}"
    if named := settings.get("SLURM_AIGC_DB_URL_FILE"):
        return (db.read_url_file(Path(named)),
                f"{named}, named by SLURM_AIGC_DB_URL_FILE in {where['SLURM_AIGC_DB_URL_FILE']}")
    url = env.default_url()
    return url, "the single-host SQLite default" if url == db.DEFAULT_DB_URL else str(db.DEFAULT_URL_FILE)


def _environment_file(path: str) -> dict[str, str]:
    try:
        return assignments(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}  # the units' `EnvironmentFile=-...`: optional
    except (OSError, UnicodeDecodeError) as error:
        raise DatabaseError(f"cannot read {path}, the daemon's environment: {error}") from error


def check_database(env: DoctorEnv, role: str, db_url: str | None) -> list[Finding]:
    fix = "check the URL file (docs/deploy.md, step 1) and the server"
    try:
        url, source = database_url(env, role, db_url)
    except AigcError as error:
        return [Finding("database", False, str(error), fix)]
    sqlite = db.sqlite_path(url)
    # Opening creates a missing SQLite file: doctor, run as root, would leave the daemon a
    # root-owned file it cannot write, and hide that its URL points nowhere.
    if sqlite is not None and not os.path.exists(sqlite):
        return [Finding("database", False, f"{sqlite} does not exist (URL from {source})",
                        "on a cluster of several hosts, name the server database (SLURM_AIGC_DB_URL_FILE in "
                        f"{env.environment_files(role)[-1]}, docs/deploy.md step 4); on one host, start the controller "
                        "first: it creates the file")]
    try:
        factory = env.open_db(url)
    except AigcError as error:
        return [Finding("database", False, f"{error} (URL from {source})", fix)]
    # SQLite has no roles: the project runs an agent on it only on the controller's host (a warning).
    role_check = _sqlite_agent(sqlite) if sqlite is not None and role == "agent" else _role(env, role, factory)
    found = [Finding("database", True, f"reachable, schema current ({db.mask_url(url)} from {source})"),
             role_check, _skew(env, factory)]
    if role == "controller":
        try:
            held = env.lease_holders(factory)
        except AigcError as error:  # e.g. a role without SELECT on leases: a finding, not a crash
            found.append(Finding("leases", False, str(error), "grant the controller role what docs/deploy.md lists"))
        else:
            found.append(Finding("leases", True, "; ".join(held) if held else
                                 "none taken yet: no controller daemon has run against this database"))
    return found


def _role(env: DoctorEnv, role: str, factory: object) -> Finding:
    can = env.privileges(factory)
    wrong = [name for name, wanted in EXPECTED[role].items() if can.get(name) != wanted]
    summary = ", ".join(f"{'can' if can[name] else 'cannot'} {name}" for name in can)
    if wrong:
        fix = (f"grant the {role} role exactly what docs/deploy.md lists (wrong: "
               + ", ".join(f"{name} should be {'allowed' if EXPECTED[role][name] else 'refused'}" for name in wrong) + ")")
        return Finding(f"database role ({role})", False, summary, fix)
    return Finding(f"database role ({role})", True, summary)


def _sqlite_agent(path: str) -> Finding:
    return Finding("database role (agent)", True, f"SQLite file {path}: no roles, and no other host reads it",
                   "agents on other hosts than the controller need a server database (docs/deploy.md); "
                   "on the controller's own host the agent must run as the controller's user", warning=True)


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


def check_slurm(env: DoctorEnv, role: str, user: str | None = None, publishes: bool = True) -> list[Finding]:
    try:
        if not env.slurm_ping():
            return [Finding("slurm", False, "slurmctld does not answer `scontrol ping`", "check SLURM_CONF and munge")]
        config = env.slurm_config()
    except AigcError as error:
        return [Finding("slurm", False, str(error), "install the Slurm client and munge on this host")]
    findings = [Finding("slurm", True, f"slurmctld answers ({config.get('SLURM_VERSION', '?')})")]
    findings.append(_rights(env, config, user or unit_settings(role)["User"], node_updates=role == "agent" and publishes))
    if role == "agent":
        findings.append(_prolog(env, config))
    else:
        findings.append(_accounted_gres(config))
        if (defect := _shard_defect(config)) is not None:
            findings.append(defect)
    return findings


def _rights(env: DoctorEnv, config: dict[str, str], user: str, *, node_updates: bool) -> Finding:
    """Whether the daemon's user may do what it does in Slurm. The controller updates jobs
    (AdminLevel Operator or above); an agent that publishes its node's static features updates
    a node, which slurmctld allows only root, its SlurmUser and AdminLevel Administrator (an
    Operator agent passed and then failed every publication). The daemon's user, not doctor's:
    root passes everything, SlurmUser has no AdminLevel."""
    if user == "root" or user == config.get("SlurmUser", "").split("(", 1)[0]:  # "slurm(64030)"
        return Finding("slurm rights", True, f"runs as {user} ({'root' if user == 'root' else 'SlurmUser'})")
    levels = ("Administrator",) if node_updates else ("Operator", "Administrator")
    fix = (f"`sacctmgr modify user {user} set adminlevel={levels[0]}`"
           + (" (node updates need it), or agent.publish_features: false" if node_updates else "")
           + " (a unit changed to run as another user: --user)")
    try:
        level = env.slurm_admin_level(user)
    except AigcError as error:
        return Finding("slurm rights", False, f"runs as {user}: {error}", fix)
    allowed = level in levels
    return Finding("slurm rights", allowed, f"runs as {user} (AdminLevel={level or 'None'})", "" if allowed else fix)


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
                   "the controller requeues the shard jobs once the jobs on it fill reclaim.gpu_conflict_memory_pct of the "
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


def check_policy(env: DoctorEnv, config_path: str | None) -> tuple[Finding, object | None]:
    """The policy's finding, and the policy (None when it does not load)."""
    try:
        policy = env.load_policy(config_path)
    except AigcError as error:
        return Finding("policy", False, str(error), "fix the file (`slurm-aigc policy check`)"), None
    return Finding("policy", True, f"{getattr(policy, 'source', config_path)} valid"), policy


def _publishes(policy: object | None) -> bool:
    """Whether the agent publishes static node features (`agent.publish_features`; a policy that
    does not load counts as the shipped default, on, and fails its own check)."""
    return bool(getattr(getattr(policy, "agent", None), "publish_features", True))


def run_checks(env: DoctorEnv, role: str, db_url: str | None, config_path: str | None,
               user: str | None = None) -> list[Finding]:
    """`user`: whose Slurm rights to check; None: the role's unit's User=."""
    checked, policy = check_policy(env, config_path)  # loaded once: the rights check reads it too
    findings = check_database(env, role, db_url) + check_slurm(env, role, user, _publishes(policy)) + [checked]
    if role == "agent":
        findings.append(check_nvml(env))
    return findings


def render(findings: Sequence[Finding]) -> str:
    lines = []
    for item in findings:
        mark = "FAIL" if not item.ok else "WARN" if item.warning else "ok  "
        lines.append(f"{mark}  {item.check}: {item.detail}")
        if (item.warning or not item.ok) and item.fix:
            lines.append(f"      fix: {item.fix}")
    return "\n".join(lines)


def real_env() -> DoctorEnv:
    from slurm_aigc.db import open_database, probe_privileges, server_time
    from slurm_aigc.lease import holders
    from slurm_aigc.policy.site import load_site_policy
    from slurm_aigc.slurm import SlurmCli
    from slurm_aigc.telemetry.nvml import NvmlBackend

    slurm = SlurmCli()

    def admin_level(user: str) -> str:
        out = slurm.run("sacctmgr", ["-nP", "show", "user", user, "format=adminlevel"]).stdout.strip()
        return out.splitlines()[0] if out else ""

    def nvml_gpus() -> int:
        backend = NvmlBackend(node="doctor")
        backend.start()
        try:
            return len(backend.read().gpus)
        finally:
            backend.close()

    def lease_holders(factory: object) -> list[str]:
        return [holder.describe() for holder in holders(factory)]  # type: ignore[arg-type]

    return DoctorEnv(
        lease_holders=lease_holders,
        open_db=open_database, privileges=probe_privileges, server_time=server_time,  # type: ignore[arg-type]
        slurm_config=slurm.show_config, slurm_ping=slurm.ping, slurm_admin_level=admin_level,
        nvml_gpus=nvml_gpus, load_policy=load_site_policy, read_text=lambda path: open(path, encoding="utf-8").read(),
    )


@click.command()
@click.option("--role", type=click.Choice(["agent", "controller"]), required=True,
              help="What this host runs: agent (compute node) or controller.")
@click.option("--db", "db_url", default=None,
              help="Database URL or credentials file (default: the daemon's, from $SLURM_AIGC_DB_URL[_FILE], "
                   "else the unit's EnvironmentFile=, else /etc/slurm-aigc/db.url).")
@click.option("--config", "config_path", default=None, help="Policy file (default: $SLURM_AIGC_CONFIG, /etc/slurm-aigc/slurm-aigc.yaml, the shipped one).")
@click.option("--user", default=None,
              help="The user the daemon runs as, whose Slurm rights to check (default: the role's unit's User=).")
def doctor(role: str, db_url: str | None, config_path: str | None, user: str | None) -> None:
    """Check this host's database role, Slurm rights, NVML, policy, Prolog and clock; say what to fix."""
    findings = run_checks(real_env(), role, db_url, config_path, user)
    click.echo(render(findings))
    if not all(item.ok for item in findings):
        raise SystemExit(1)
