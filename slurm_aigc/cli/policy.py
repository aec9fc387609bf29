"""`slurm-aigc policy check|render|install` and `slurm-aigc classify` (thin click commands)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click

from slurm_aigc.errors import AigcError
from slurm_aigc.fsio import atomic_write_text
from slurm_aigc.policy.hookruntime import INFINITE, NICE_OFFSET, NO_VAL, HookResult, HookRuntime
from slurm_aigc.policy.install import HOOK_FILE, install_hook
from slurm_aigc.policy.model import UNKNOWN_CLASS, Policy
from slurm_aigc.policy.render import MARKER, render_hook, render_policy_table
from slurm_aigc.policy.site import load_site_policy
from slurm_aigc.slurm import slurm_conf_dir

POLICY_OPTION = click.option(
    "--policy", "policy_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Policy YAML (default: $SLURM_AIGC_CONFIG, /etc/slurm-aigc/slurm-aigc.yaml, the shipped etc/slurm-aigc.yaml).",
)


def _parse_version(_ctx: click.Context | None, _param: click.Parameter | None, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    if not re.fullmatch(r"\d{1,3}\.\d{1,2}(\.\d{1,3})?", text):
        raise click.BadParameter(f"expected a Slurm release such as 22.05 or 24.11.5, got {text!r}")
    return tuple(int(part) for part in text.split("."))


SLURM_VERSION_OPTION = click.option(
    "--slurm-version", "slurm_version", callback=_parse_version, default=None, metavar="X.Y[.Z]",
    help="The Slurm release the hook is for (default: `scontrol --version` here, read locally); "
         "rewrites.whole_as_shards: auto depends on it.")


def slurm_version_here(given: tuple[int, ...] | None, quiet: bool = False) -> tuple[int, ...] | None:
    """`given`, else the installed Slurm's (`scontrol --version`: no RPC), else None (with a note)."""
    if given is not None:
        return given
    try:
        from slurm_aigc.slurm import SlurmCli

        return SlurmCli(timeout_s=5.0).version()
    except (AigcError, OSError) as error:
        if not quiet:
            click.echo(f"note: cannot read the Slurm version here ({error}); rendering for an unknown release "
                       "(rewrites.whole_as_shards: auto is off); pass --slurm-version", err=True)
        return None


def _load(policy_path: Path | None) -> Policy:
    """--policy, else `$SLURM_AIGC_CONFIG`, /etc/slurm-aigc/slurm-aigc.yaml, the shipped one."""
    return load_site_policy(policy_path)


@click.group("policy")
def policy() -> None:
    """Validate, render and install the job_submit hook's policy."""


@policy.command("check")
@POLICY_OPTION
def check(policy_path: Path | None) -> None:
    """Validate the policy; errors name the file, the key path and what is wrong."""
    loaded = _load(policy_path)
    types = ", ".join(f"{t.name} ({t.memory_gib:g} GiB)" for t in loaded.inventory.gpu_types)
    click.echo(f"ok: {loaded.source}: {len(loaded.classes)} classes, {len(loaded.detection)} detection rules, GPU types {types}")


@policy.command("render")
@POLICY_OPTION
@click.option("--table-only", is_flag=True, help="Print only the Lua policy table.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write here instead of stdout.")
@SLURM_VERSION_OPTION
def render(policy_path: Path | None, table_only: bool, output: Path | None, slurm_version: tuple[int, ...] | None) -> None:
    """Print the job_submit.lua (policy table + hook) that `install` would write."""
    loaded = _load(policy_path)
    version = slurm_version_here(slurm_version)
    text = render_policy_table(loaded, version) if table_only else render_hook(loaded, slurm_version=version)
    if output:
        _write_output(output, text)
    else:
        click.echo(text, nl=False)


def _write_output(output: Path, text: str) -> None:
    """`render -o`: atomically, as `install` writes. -o may name the live job_submit.lua, and a
    write that truncated it first and then failed left slurmctld a broken hook."""
    target = output.resolve()  # through a symlink to the file it names, as writing in place did
    try:
        atomic_write_text(target, text, durable=True)
    except OSError as error:
        raise AigcError(f"cannot write {output}: {error.strerror or error}") from error


@policy.command("install")
@POLICY_OPTION
@click.option("--slurm-conf-dir", "conf_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Slurm's config dir (default: the directory of $SLURM_CONF / /etc/slurm/slurm.conf).")
@click.option("--reconfigure", is_flag=True, help="Run `scontrol reconfigure` afterwards (resets features set by scontrol update).")
@click.option("--force", is_flag=True, help="Replace a job_submit.lua that is not slurm-aigc's (it is copied aside first).")
@SLURM_VERSION_OPTION
def install(policy_path: Path | None, conf_dir: Path | None, reconfigure: bool, force: bool,
            slurm_version: tuple[int, ...] | None) -> None:
    """Validate, render, `luac -p`, then atomically replace <slurm conf dir>/job_submit.lua."""
    loaded = _load(policy_path)
    text = render_hook(loaded, slurm_version=slurm_version_here(slurm_version))
    HookRuntime(text)  # loads in Lua 5.1 the way slurmctld does; raises if it would not
    result = install_hook(text, conf_dir or slurm_conf_dir(), force=force)
    if result.backup is not None:
        click.echo(f"the site's own {HOOK_FILE} was copied to {result.backup}")
    click.echo(f"installed {result.path} ({result.bytes_written} bytes) from {loaded.source}")
    if reconfigure:
        from slurm_aigc.slurm import SlurmCli

        SlurmCli().reconfigure()
        click.echo("scontrol reconfigure: done")


def hook_text(policy_path: Path | None, conf_dir: Path | None = None,
              slurm_version: tuple[int, ...] | None = None) -> tuple[str, str]:
    """(Lua text, where it came from): --policy rendered (for `slurm_version`), else the installed
    hook, else the default policy."""
    if policy_path is None:
        try:
            installed = (conf_dir or slurm_conf_dir()) / HOOK_FILE
            text = installed.read_text(encoding="utf-8")
        except (OSError, AigcError, UnicodeDecodeError):  # none, or a site's own hook (not ours: not UTF-8)
            text = ""
        if text.startswith(MARKER):
            return text, str(installed)
    loaded = _load(policy_path)
    return render_hook(loaded, slurm_version=slurm_version), loaded.source


def _tres_prefix(style: str, version: tuple[int, ...] | None) -> str:
    """Slurm 22.05 shows `gres:gpu:1` to Lua; 23.02 and later `gres/gpu:1` (auto: `version`'s)."""
    if style == "22.05":
        return "gres:"
    if style == "23.02":
        return "gres/"
    return "gres:" if version is None or tuple(version[:2]) < (23, 2) else "gres/"


def partitions_of(scontrol_text: str) -> dict[str, dict[str, Any]]:
    """`scontrol show partition -o` -> part_list entries as job_submit/lua shows them (minutes).

    Partition lines are written by admins only (slurm.conf), so key=value reading is safe here.
    """
    from slurm_aigc.slurm import parse_key_values

    parts: dict[str, dict[str, Any]] = {}
    for line in scontrol_text.splitlines():
        fields = parse_key_values(line)
        name = fields.get("PartitionName")
        if name:
            parts[name] = {"name": name, "max_time": _minutes(fields.get("MaxTime")),
                           "default_time": _minutes(fields.get("DefaultTime")),
                           "flag_default": 1 if fields.get("Default") == "YES" else 0}
    return parts


def _minutes(text: str | None) -> int:
    """`UNLIMITED` -> INFINITE, `NONE`/absent -> NO_VAL, `1-00:00:00` -> 1440 (as part_list holds them)."""
    from slurm_aigc.slurm import parse_duration_s

    if text == "UNLIMITED":
        return INFINITE
    seconds = parse_duration_s(text)
    return NO_VAL if seconds is None else seconds // 60


def _cluster_partitions() -> dict[str, dict[str, Any]]:
    from slurm_aigc.slurm import SlurmCli

    try:
        text = SlurmCli(timeout_s=10.0).run("scontrol", ["show", "partition", "-o"]).stdout
    except (AigcError, OSError) as error:
        raise click.ClickException(f"cannot read the cluster's partitions ({error}); "
                                   "use --partitions-from none to classify without them") from error
    return partitions_of(text)


def _gres_value(text: str | None, prefix: str) -> str | None:
    if not text:
        return None
    entries = [e if e.startswith(("gres:", "gres/")) else prefix + e for e in text.split(",")]
    return ",".join(entries)


def job_fields(options: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The job_desc sbatch/srun would send for these options (unset fields omitted)."""
    fields: dict[str, Any] = {
        "comment": options["comment"], "name": options["name"], "partition": options["partition"],
        "qos": options["qos"], "account": options["account"], "features": options["constraint"],
        "prefer": options["prefer"], "time_limit": options["time_minutes"], "min_nodes": options["nodes"],
        "tres_per_node": _gres_value(options["gres"], prefix), "user_id": options["user_id"],
        "tres_per_job": _gres_value(f"gpu:{options['gpus']}" if options["gpus"] else None, prefix),
        "script": None if options["interactive"] else "#!/bin/bash\n# slurm-aigc classify\n",
    }
    return {k: v for k, v in fields.items() if v is not None}


def result_json(result: HookResult) -> dict[str, Any]:
    """The exact `classify --json` object."""
    return {
        "class": result.job_class or UNKNOWN_CLASS,
        "result": "accept" if result.accepted else "reject",
        "changes": {k: [before, after] for k, (before, after) in result.changes.items()},
        "messages": result.messages,
    }


# The job's numbers as sbatch accepts them: Slurm keeps them in 32 bits, the top two values
# meaning NO_VAL and INFINITE (4294967294, 4294967295); a negative count sbatch refuses.
_SLURM_MAX = NO_VAL - 1
_SLURM_COUNT = click.IntRange(0, _SLURM_MAX)
# A count in a --gres entry (`gpu:-3`, `gpu:a100:-1`): sbatch refuses a negative one.
_NEGATIVE_COUNT = re.compile(r":-\d")


def _checked_gres(_ctx: click.Context, _param: click.Parameter, text: str | None) -> str | None:
    """--gres as given, unless an entry's count is negative."""
    for entry in (text or "").split(","):
        if _NEGATIVE_COUNT.search(entry):
            raise click.BadParameter(f"{entry!r}: a GRES count cannot be negative (e.g. gpu:1, gpu:a100:2)")
    return text


@click.command("classify")
@click.option("--comment", default=None, help="The job's --comment (where the aigc: tag lives).")
@click.option("--gres", default=None, callback=_checked_gres, help="As sbatch --gres, e.g. gpu:1 or gpu:a100:2.")
@click.option("--gpus", type=_SLURM_COUNT, default=None, help="As sbatch --gpus (per job).")
@click.option("--name", default=None, help="Job name (-J).")
@click.option("--nodes", type=click.IntRange(1, _SLURM_MAX), default=None, help="-N.")
@click.option("--partition", default=None)
@click.option("--qos", default=None)
@click.option("--account", default=None)
@click.option("--constraint", default=None)
@click.option("--prefer", default=None)
@click.option("--time-minutes", type=click.IntRange(1, _SLURM_MAX), default=None, help="--time in minutes.")
@click.option("--script/--interactive", "batch", default=True, help="sbatch (default) or srun/salloc (no batch script).")
@click.option("--user-id", type=_SLURM_COUNT, default=1000, show_default=True, help="Submitting uid (0 = root: never rewritten).")
@click.option("--user", "user", default=None,
              help="Submitting user (name or uid; instead of --user-id): also prints what was learned for this job.")
@click.option("--tres-style", type=click.Choice(["auto", "22.05", "23.02"]), default="auto",
              help="How Slurm shows GPU requests to Lua (auto: from --slurm-version).")
@click.option("--partitions-from", type=click.Choice(["cluster", "none"]), default="cluster", show_default=True,
              help="part_list as slurmctld hands it to the hook: the cluster's partitions (scontrol), or none.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@SLURM_VERSION_OPTION
@POLICY_OPTION
def classify(as_json: bool, policy_path: Path | None, tres_style: str, batch: bool, partitions_from: str,
             user: str | None, slurm_version: tuple[int, ...] | None, **options: Any) -> None:
    """Run the installed job_submit.lua (or --policy's) on a job, without submitting it."""
    version = slurm_version_here(slurm_version, quiet=True)
    text, source = hook_text(policy_path, slurm_version=version)
    runtime = HookRuntime(text)
    options["interactive"] = not batch
    learned = _learned_of(user, options, policy_path)
    fields = job_fields(options, _tres_prefix(tres_style, version))
    parts = _cluster_partitions() if partitions_from == "cluster" else {}
    result = runtime.submit(fields, submit_uid=options["user_id"], partitions=parts)
    for line in result.logged("error"):
        click.echo(f"slurmctld would log: error: {line}", err=True)
    if as_json:
        click.echo(json.dumps(result_json(result) | ({"learned": learned} if learned is not None else {})))
        return
    _print_text(result, source)
    if learned is not None:
        _print_learned(learned)


def _learned_of(user: str | None, options: dict[str, Any], policy_path: Path | None) -> dict[str, Any] | None:
    """With --user: the uid it names becomes the submitting uid, and what was learned for the job (or None)."""
    if user is None:
        return None
    from slurm_aigc.cli.learned import explain, resolve_uid

    options["user_id"] = resolve_uid(user)
    return explain(options["user_id"], options["name"], _load(policy_path).learned)


def _print_learned(learned: dict[str, Any]) -> None:
    key = learned["key"]
    state = "" if learned["enabled"] else " (learning is off in this policy: the hook ignores the table)"
    click.echo(f"learned: key uid={key['uid']} pattern={key['pattern'] or '(none)'} in {learned['file']}{state}")
    if "problem" in learned:
        click.echo(f"learned: {learned['problem']}")
    elif learned["entry"] is None:
        click.echo("learned: no entry for this key")
    else:
        entry = learned["entry"]
        vram = "-" if entry["vram_gib"] is None else f"{entry['vram_gib']}G"
        sm = "-" if entry["sm"] is None else entry["sm"]
        click.echo(f"learned: class={entry['class'] or '-'} vram={vram} sm={sm} "
                   f"from {entry['jobs']} job(s), class from {entry['class_jobs']}")
        click.echo(f"learned: why: {learned['why']}")


def _print_text(result: HookResult, source: str) -> None:
    summary = result_json(result)
    click.echo(f"class:   {summary['class']}")
    click.echo(f"result:  {summary['result']}")
    click.echo(f"hook:    {source}")
    if not result.changes:
        click.echo("changes: none")
    for field, (before, after) in result.changes.items():
        click.echo(f"change:  {field}: {_show(before, field)} -> {_show(after, field)}")
    for message in result.messages:
        click.echo(f"message: {message}")


def _show(value: object, field: str = "") -> str:
    if field == "nice" and isinstance(value, int):
        # job_desc.nice is the user's nice + NICE_OFFSET; NO_VAL means unset.
        return "(unset)" if value == NO_VAL else str(value - NICE_OFFSET)
    return "(unset)" if value is None else str(value)


__all__ = ["classify", "policy"]
