"""policy install: luac check first, then atomic replace with an mtime newer than any earlier load."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_aigc.policy.install import (
    PolicyInstallError,
    atomic_write,
    install_hook,
    syntax_check,
)

GOOD = "function slurm_job_submit() return slurm.SUCCESS end\nreturn slurm.SUCCESS\n"


def fake_luac(returncode: int, stderr: str = "") -> tuple[list[list[str]], object]:
    calls: list[list[str]] = []

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), returncode, "", stderr)

    return calls, run


def test_atomic_write_replaces_with_future_mtime_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "job_submit.lua"
    target.write_text("old")
    os.utime(target, (999_000.0, 999_000.0))
    result = atomic_write(target, "new", clock=lambda: 1_000_000.7)
    assert target.read_text() == "new"
    assert os.stat(target).st_mtime == 1_000_001.0 == result.mtime_s
    assert [p.name for p in tmp_path.iterdir()] == ["job_submit.lua"]


def test_back_to_back_installs_always_move_mtime_forward(tmp_path: Path) -> None:
    target = tmp_path / "job_submit.lua"
    first = atomic_write(target, "one", clock=lambda: 500.2)
    second = atomic_write(target, "two", clock=lambda: 500.9)  # same second as the first
    assert (first.mtime_s, second.mtime_s) == (501.0, 502.0)


def test_install_checks_syntax_before_touching_the_file(tmp_path: Path) -> None:
    target = tmp_path / "job_submit.lua"
    target.write_text("previous")
    calls, run = fake_luac(1, "luac5.1: /tmp/x.lua:1: unexpected symbol near 'end'")
    with pytest.raises(PolicyInstallError, match="unexpected symbol"):
        install_hook("end end", tmp_path, luac="luac5.1", run=run)  # type: ignore[arg-type]
    assert target.read_text() == "previous"
    assert calls[0][:2] == ["luac5.1", "-p"]


def test_install_writes_when_luac_accepts(tmp_path: Path) -> None:
    _, run = fake_luac(0)
    result = install_hook(GOOD, tmp_path, luac="luac5.1", run=run)  # type: ignore[arg-type]
    assert result.path.read_text() == GOOD


def test_install_into_missing_directory_fails_cleanly(tmp_path: Path) -> None:
    _, run = fake_luac(0)
    with pytest.raises(PolicyInstallError, match="not a directory"):
        install_hook(GOOD, tmp_path / "nope", luac="luac5.1", run=run)  # type: ignore[arg-type]


@pytest.mark.skipif(shutil.which("luac5.1") is None, reason="luac5.1 (Debian lua5.1) not installed")
def test_real_luac_rejects_broken_lua() -> None:
    syntax_check(GOOD)
    with pytest.raises(PolicyInstallError, match="job_submit.lua"):
        syntax_check("function (")


SITE_HOOK = "-- our site's own submit filter\nfunction slurm_job_submit() return slurm.SUCCESS end\n"
OURS = "-- slurm-aigc job_submit.lua (rendered)\n" + GOOD


def test_a_sites_own_hook_is_not_replaced_without_force(tmp_path: Path) -> None:
    target = tmp_path / "job_submit.lua"
    target.write_text(SITE_HOOK)
    _, run = fake_luac(0)
    with pytest.raises(PolicyInstallError, match="not slurm-aigc's.*--force"):
        install_hook(OURS, tmp_path, luac="luac5.1", run=run)  # type: ignore[arg-type]
    assert target.read_text() == SITE_HOOK
    assert [p.name for p in tmp_path.iterdir()] == ["job_submit.lua"]


def test_force_replaces_a_sites_hook_after_copying_it_aside(tmp_path: Path) -> None:
    target = tmp_path / "job_submit.lua"
    target.write_text(SITE_HOOK)
    _, run = fake_luac(0)
    first = install_hook(OURS, tmp_path, luac="luac5.1", run=run, clock=lambda: 1_800_000_000.0, force=True)  # type: ignore[arg-type]
    assert target.read_text() == OURS
    assert first.backup == tmp_path / "job_submit.lua.site-backup-20270115T080000Z"
    assert first.backup.read_text() == SITE_HOOK
    target.write_text(SITE_HOOK + "-- edited again\n")  # a second forced install in the same second
    second = install_hook(OURS, tmp_path, luac="luac5.1", run=run, clock=lambda: 1_800_000_000.0, force=True)  # type: ignore[arg-type]
    assert second.backup is not None and second.backup.name.endswith(".1")
    assert first.backup.read_text() == SITE_HOOK  # an earlier backup is never overwritten


def test_our_own_hook_and_the_placeholder_are_replaced_without_a_backup(tmp_path: Path) -> None:
    target = tmp_path / "job_submit.lua"
    _, run = fake_luac(0)
    for previous in (OURS, "-- slurm-aigc placeholder: accepts every job\nreturn slurm.SUCCESS\n", ""):
        target.write_text(previous)
        assert install_hook(OURS, tmp_path, luac="luac5.1", run=run).backup is None  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job_submit.lua"]
