"""The local cluster's process table: where the daemons it starts run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from slurm_aigc.localcluster.manager import ProcessTable, _wait


def test_daemons_run_in_the_run_directory_not_in_the_callers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The caller's directory (a checkout) may be deleted while the cluster runs; the daemons'
    # own must not be. Before the fix the child inherited the caller's directory.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    table = ProcessTable(run_dir)
    log = tmp_path / "daemon.log"
    table.start("probe", [sys.executable, "-c", "import os; print(os.getcwd())"], log)
    assert _wait(lambda: not table.alive("probe"), 30)
    assert Path(log.read_text().strip()) == run_dir
    assert Path(os.getcwd()) == checkout
