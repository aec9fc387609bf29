"""`slurm-aigc shipped [NAME]`: where this install keeps the files it ships (thin click command)."""

from __future__ import annotations

import click

from slurm_aigc.shipped import SHIPPED, shipped_file


@click.command("shipped")
@click.argument("name", required=False, type=click.Choice(SHIPPED), metavar="[NAME]")
def shipped(name: str | None) -> None:
    """Print the path of shipped file NAME, or list every shipped file with its path.

    Without NAME it lists the names. For admins of a wheel install, e.g.

    \b
      cp "$(slurm-aigc shipped daemon/slurm-aigc-agent.service)" /etc/systemd/system/
    """
    if name:
        click.echo(shipped_file(name))
        return
    width = max(len(n) for n in SHIPPED)
    for each in SHIPPED:
        click.echo(f"{each:<{width}}  {shipped_file(each)}")
