"""`slurm-aigc learned show|update`: the learned defaults for untagged jobs (policy `learned:`)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import click

from slurm_aigc.errors import AigcError
from slurm_aigc.policy.model import LearnedConfig
from slurm_aigc.telemetry.learned import COMPUTING_MIN_PCT, LearnedEntry, lookup, name_pattern, parse_table
from slurm_aigc.textfmt import text_table

config_option = click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
                             help="Policy file (default: $SLURM_AIGC_CONFIG, /etc/slurm-aigc/slurm-aigc.yaml, the shipped one).")


class LearnedFileError(AigcError):
    """The learned-defaults file is missing, unsafe or unreadable."""

    exit_code = 2


def _config(config_file: str | None) -> LearnedConfig:
    from slurm_aigc.policy.site import load_site_policy

    return load_site_policy(config_file, hook_sections=False).learned


def file_problems(path: Path, trusted_uids: frozenset[int] = frozenset({0})) -> list[str]:
    """Why the hook should not trust `path`: not a regular file, writable by others, or owned by a user.

    The hook itself cannot stat a file in Lua 5.1, so this is checked here (and by `learned show`).
    """
    try:
        info = path.stat()
        parent = path.parent.stat()
    except OSError as error:
        return [f"cannot stat: {error.strerror or error}"]
    problems = []
    if not stat.S_ISREG(info.st_mode):
        problems.append("not a regular file")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problems.append(f"writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})")
    if info.st_uid not in trusted_uids:
        problems.append(f"owned by uid {info.st_uid}, not root or SlurmUser")
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        problems.append(f"its directory {path.parent} is writable by anyone")
    return problems


def read_entries(path: Path) -> list[LearnedEntry]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise LearnedFileError(f"{path}: no learned table yet (the controller writes it when learned.enabled)") from None
    except OSError as error:
        raise LearnedFileError(f"{path}: cannot read: {error.strerror or error}") from None
    return parse_table(data, str(path))


def entry_json(entry: LearnedEntry) -> dict[str, Any]:
    return {"uid": entry.uid, "user": entry.user, "pattern": entry.pattern, "class": entry.job_class,
            "vram_gib": entry.vram_gib, "sm": entry.sm, "jobs": entry.jobs, "class_jobs": entry.class_jobs,
            "p50_peak_mib": entry.p50_peak_mib, "p95_peak_mib": entry.p95_peak_mib}


def why(entry: LearnedEntry, config: LearnedConfig) -> str:
    """One line saying where each value of an entry came from."""
    parts = []
    if entry.job_class:
        parts.append(f"class {entry.job_class}: at least {config.min_class_share:.0%} of {entry.class_jobs} stamped "
                     "job(s) (the hook's own guesses do not count)")
    if entry.vram_gib is not None and entry.p95_peak_mib is not None:
        parts.append(f"vram {entry.vram_gib}G: p95 of {entry.jobs} job peaks {entry.p95_peak_mib:.0f} MiB "
                     f"+ {config.vram_margin_pct:g} %, rounded up")
    elif entry.p95_peak_mib is not None and entry.p50_peak_mib is not None:
        parts.append(f"no vram: the {entry.jobs} job peaks spread from a median {entry.p50_peak_mib:.0f} MiB to a p95 "
                     f"{entry.p95_peak_mib:.0f} MiB, over max_vram_spread {config.max_vram_spread:g}x: the name "
                     "covers jobs of different sizes")
    if entry.sm is not None:
        parts.append(f"sm {entry.sm:g}: the highest of {entry.jobs} job(s) SM while computing (samples above "
                     f"{COMPUTING_MIN_PCT:g} %)")
    return "; ".join(parts) + f" (jobs that ended in the last {config.max_age_days:g} days)"


@click.group("learned")
def learned() -> None:
    """Learned defaults for untagged jobs: what the controller learned, per user and job-name pattern."""


@learned.command("show")
@config_option
@click.option("--file", "file_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The table to read (default: learned.file of the policy).")
@click.option("--user", "user", default=None, help="Only this user's entries (a name or a uid).")
@click.option("--name", "name", default=None, help="Only the entry a job of this name would use (with --user).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per entry.")
def show(config_file: str | None, file_path: Path | None, user: str | None, name: str | None, as_json: bool) -> None:
    """Print the learned table (and warn when the hook should not trust the file)."""
    config = _config(config_file)
    path = file_path or Path(config.file)
    entries = read_entries(path)
    for problem in file_problems(path, frozenset({0, os.geteuid()})):
        click.echo(f"warning: {path}: {problem}: only root (or SlurmUser) may write the table the hook reads", err=True)
    if user is not None:
        uid = resolve_uid(user)
        entries = [e for e in entries if e.uid == uid]
        if name is not None:
            found = lookup(entries, uid, name)
            entries = [found] if found else []
    if as_json:
        for entry in entries:
            click.echo(json.dumps(entry_json(entry)))
        return
    rows = [[str(e.uid), e.user, e.pattern, e.job_class or "-", "-" if e.vram_gib is None else f"{e.vram_gib}G",
             "-" if e.sm is None else f"{e.sm:g}", str(e.jobs), str(e.class_jobs)] for e in entries]
    click.echo(text_table(["uid", "user", "pattern", "class", "vram", "sm", "jobs", "class jobs"], rows))
    status = "on" if config.enabled else "off (learned.enabled: false: the hook ignores the table)"
    click.echo(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} in {path}; learning {status}")


@learned.command("update")
@config_option
@click.option("--db", "db_url", default=None, help="Database URL (default: $SLURM_AIGC_DB_URL or the state database).")
@click.option("--dry-run", is_flag=True, help="Learn and print, write nothing.")
def update(config_file: str | None, db_url: str | None, dry_run: bool) -> None:
    """Learn now from sacct and the samples and write the table (what the controller does every interval_s)."""
    from slurm_aigc.cli.env import SACCT_TIMEOUT_S
    from slurm_aigc.policy.site import load_site_policy
    from slurm_aigc.slurm import SlurmCli
    from slurm_aigc.telemetry.learnpublish import open_learner

    policy = load_site_policy(config_file, hook_sections=False)
    # In the foreground, nothing else waits: the reports' sacct timeout, and the whole range in one run.
    learner = open_learner(policy.learned, policy.classes, db_url, SlurmCli(timeout_s=SACCT_TIMEOUT_S), dry_run=dry_run)
    entries = learner.tick() or []
    verb = "would write" if dry_run else "wrote"
    click.echo(f"{verb} {len(entries)} learned default(s) to {policy.learned.file}")


def resolve_uid(user: str) -> int:
    """A user name or a numeric uid -> the uid (`id -u USER`)."""
    import pwd

    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise click.BadParameter(f"no such user {user!r}", param_hint="--user") from None


def explain(uid: int, name: str | None, config: LearnedConfig) -> dict[str, Any]:
    """What `classify --user` prints about learning: the key, and the entry with why, if any."""
    pattern = name_pattern(name)
    found: dict[str, Any] = {"enabled": config.enabled, "file": config.file, "key": {"uid": uid, "pattern": pattern}}
    try:
        entry = lookup(read_entries(Path(config.file)), uid, name)
    except LearnedFileError as error:
        found["problem"] = str(error)
        return found
    found["entry"] = None if entry is None else entry_json(entry)
    found["why"] = None if entry is None else why(entry, config)
    return found


__all__ = ["explain", "learned", "resolve_uid"]
