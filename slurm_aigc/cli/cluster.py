"""`slurm-aigc cluster up|down|status`: the local multi-node GPU Slurm cluster."""

from __future__ import annotations

import json
from pathlib import Path

import click

from slurm_aigc.localcluster.manager import LocalCluster
from slurm_aigc.localcluster.shape import DEFAULT_SHAPE


def _progress(message: str) -> None:
    click.echo(f"[cluster] {message}", err=True)


def _cluster(state_dir: Path | None) -> LocalCluster:
    return LocalCluster(state_dir, progress=_progress)


state_option = click.option("--state-dir", type=click.Path(path_type=Path), default=None,
                            help="State/log directory (default $SLURM_AIGC_CLUSTER_DIR or /var/lib/slurm-aigc/cluster).")


@click.group()
def cluster() -> None:
    """A local Slurm cluster with simulated GPUs on this machine (needs root)."""


@cluster.command()
@click.option("--shape", default=None, help=f"Nodes as TYPE:GPUSxNODES,... (default {DEFAULT_SHAPE}).")
@click.option("--no-install", is_flag=True, help="Do not apt-get install missing packages.")
@click.option("--timeout", "timeout_s", default=120.0, show_default=True, help="Seconds to wait for idle nodes.")
@click.option("--replace", is_flag=True, help="If a cluster of another shape is up, stop it and start this shape.")
@state_option
def up(shape: str | None, no_install: bool, timeout_s: float, replace: bool, state_dir: Path | None) -> None:
    """Install what is missing, start munge, MariaDB, slurmdbd, slurmctld and one slurmd per node; wait until idle.

    Without --shape, the last shape started from this state directory is used (else the default).
    """
    result = _cluster(state_dir).up(shape, install=not no_install, timeout_s=timeout_s, replace=replace)
    click.echo(f"{len(result.nodes)} nodes up: " + ", ".join(f"{n.name}({n.gpu_count}x{n.gpu.gres_type})" for n in result.nodes))


@cluster.command()
@click.option("--purge", is_flag=True, help="Also remove the state directory, logs and accounting database.")
@state_option
def down(purge: bool, state_dir: Path | None) -> None:
    """Stop only the processes `up` started (by pid)."""
    stopped = _cluster(state_dir).down(purge=purge)
    click.echo(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@cluster.command()
@click.option("--json", "as_json", is_flag=True)
@state_option
def status(as_json: bool, state_dir: Path | None) -> None:
    """Say which of the cluster's processes run."""
    local = _cluster(state_dir)
    rows = local.status()
    if as_json:
        click.echo(json.dumps({"state_dir": str(local.state_dir), "up": local.is_up(),
                               "processes": [{"name": r.name, "pid": r.pid, "running": r.running} for r in rows]}))
        return
    click.echo(f"state: {local.state_dir} ({'up' if local.is_up() else 'not up'})")
    for row in rows:
        click.echo(f"  {row.name:<16} pid {row.pid or '-':>7}  {'running' if row.running else 'STOPPED'}")
