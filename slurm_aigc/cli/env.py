"""The side effects of the commands that read Slurm and the database, in one replaceable object.

`slurm-aigc report` and `slurm-aigc replay --from-sacct` take them from here; tests hand their
own in through `CliRunner.invoke(obj=CliEnv(...))`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import click

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from slurm_aigc.slurm import SlurmCli

S = TypeVar("S")
SACCT_TIMEOUT_S = 300.0  # a month of sacct on a busy site takes minutes


@dataclass(frozen=True)
class CliEnv(Generic[S]):
    """How a command reaches Slurm (`S`: what it needs of `SlurmCli`), the database and the clock."""

    slurm: Callable[[], S]
    database: Callable[[str | None], sessionmaker[Session]]
    now: Callable[[], datetime]


def default_env() -> CliEnv[SlurmCli]:
    """The real ones, imported only when a command runs (the CLI starts fast)."""
    from slurm_aigc.db import DB_LONG_TIMEOUT_S, open_database
    from slurm_aigc.slurm import SlurmCli

    # Reports and replays read whole windows: the long database bound, as for sacct. They only
    # read it: a missing SQLite file (a typo in --db) is an error, never a new database.
    return CliEnv(slurm=lambda: SlurmCli(timeout_s=SACCT_TIMEOUT_S),
                  database=lambda url: open_database(url, timeout_s=DB_LONG_TIMEOUT_S, create=False), now=datetime.now)


def command_env(ctx: click.Context) -> CliEnv[Any]:
    """The env a test passed as the root context's `obj`, else the real one."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, CliEnv) else default_env()
