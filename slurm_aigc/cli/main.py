"""The `slurm-aigc` command: registers each area's commands and maps errors to exit codes."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

import click

from slurm_aigc import __version__
from slurm_aigc.errors import AigcError

# (module, attribute) of every command group or command; modules import lazily so that
# `slurm-aigc classify` (run per job in benchmarks) does not pay for matplotlib or SQLAlchemy.
COMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("slurm_aigc.cli.cluster", "cluster"),
    "policy": ("slurm_aigc.cli.policy", "policy"),
    "classify": ("slurm_aigc.cli.policy", "classify"),
    "learned": ("slurm_aigc.cli.learned", "learned"),
    "topo": ("slurm_aigc.cli.telemetry", "topo"),
    "gpu-load": ("slurm_aigc.cli.telemetry", "gpu_load"),
    "agent": ("slurm_aigc.cli.telemetry", "agent"),
    "controller": ("slurm_aigc.cli.reclaim", "controller"),
    "idle": ("slurm_aigc.cli.reclaim", "idle"),
    "audit": ("slurm_aigc.cli.reclaim", "audit"),
    "report": ("slurm_aigc.cli.report", "report"),
    "replay": ("slurm_aigc.cli.replay", "replay"),
    "demo": ("slurm_aigc.cli.demo", "demo"),
    "shipped": ("slurm_aigc.cli.shipped", "shipped"),
    "gpu-check": ("slurm_aigc.cli.gpucheck", "gpu_check"),
    "doctor": ("slurm_aigc.cli.doctor", "doctor"),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if _available(name))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, attribute = COMMANDS[cmd_name]
        module = importlib.import_module(module_name)
        command = getattr(module, attribute)
        assert isinstance(command, click.Command)
        return command


def _available(name: str) -> bool:
    return importlib.util.find_spec(COMMANDS[name][0]) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slurm-aigc")
@click.option("-v", "--verbose", count=True, help="More logging (repeat for debug).")
def cli(verbose: int) -> None:
    """AIGC-aware GPU scheduling for Slurm: hook, telemetry, idle reclaim, reports, replay."""
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main() -> None:
    """Entry point: run the CLI, turning our own errors into one line and their exit code."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except AigcError as error:
        click.echo(f"slurm-aigc: error: {error}", err=True)
        sys.exit(error.exit_code)
    except SystemExit:
        raise
