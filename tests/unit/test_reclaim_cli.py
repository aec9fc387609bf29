"""`slurm-aigc audit` and `slurm-aigc idle` through click's CliRunner: bad input is one line,
and a command that only reads creates no database."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_aigc.cli import reclaim
from slurm_aigc.cli.main import cli
from slurm_aigc.db import open_database
from slurm_aigc.errors import DatabaseError


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """`idle` must fail before it asks Slurm anything (and never reaches a real cluster here)."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("reached Slurm")
    monkeypatch.setattr(reclaim, "SlurmCli", refuse)


@pytest.mark.parametrize("command", [["audit"], ["idle", "list"], ["idle", "explain", "101"]])
def test_a_reader_creates_no_database_for_a_typo(tmp_path: Path, command: list[str]) -> None:
    # Before the fix `audit` said "no actions recorded", exit 0, leaving nodir/, typo.db and typo.db.schema-lock.
    missing = tmp_path / "nodir" / "typo.db"
    result = CliRunner().invoke(cli, [*command, "--db", f"sqlite:///{missing}"])
    assert isinstance(result.exception, DatabaseError) and result.exit_code == 1  # main() prints it as one line
    assert str(result.exception).startswith(f"sqlite:///{missing}: no such database file")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("since", "shown"), [("99999999999d", "out of range: 'now-99999999999d'"),
                                              ("now-99999999days", "out of range: 'now-99999999days'"),
                                              ("yesterday-ish", "not a time: 'yesterday-ish'")])
def test_audit_checks_since_before_opening_the_database(tmp_path: Path, since: str, shown: str) -> None:
    # Before the fix: an OverflowError traceback, after the database had been created.
    result = CliRunner().invoke(cli, ["audit", "--since", since, "--db", f"sqlite:///{tmp_path / 'new' / 'state.db'}"])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2
    assert f"Invalid value for --since: {shown}" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_audit_reads_an_existing_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    open_database(url)
    result = CliRunner().invoke(cli, ["audit", "--since", "2h", "--db", url])
    assert result.exit_code == 0 and result.stdout == "no actions recorded\n"
