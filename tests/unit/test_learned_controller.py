"""The learner runs under the shipped controller unit (review of issue 14.4, defect 2), and each
caller of the learner gets the sacct timeout of its purpose (defect 4).

The learner was wired only together with the feature publisher, and the shipped unit starts
`slurm-aigc controller --no-publisher`: with `learned.enabled: true` no table was ever written.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from slurm_aigc.cli import reclaim
from slurm_aigc.cli.env import SACCT_TIMEOUT_S
from slurm_aigc.cli.learned import learned
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.telemetry.learned import parse_table
from tests.unit.test_daemon_units import CONTROLLER, settings
from tests.unit.test_learnpublish import FakeSacct

UIDS = {"aigc-alice": 1001}


class FakeSlurm(FakeSacct):
    """`SlurmCli` as the commands build it; only sacct is answered. Remembers each one built."""

    built: list[FakeSlurm] = []

    def __init__(self, *_args: Any, timeout_s: float | None = None, **_kwargs: Any) -> None:
        super().__init__()
        self.timeout_s = timeout_s
        for i in range(5):
            self.add(100 + i, f"sd-gen-{i:04d}", end=time.time() - 7200)
        FakeSlurm.built.append(self)


@pytest.fixture
def policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    document = yaml.safe_load(shipped_policy().read_text())
    document["learned"].update(enabled=True, file=str(tmp_path / "learned.txt"), max_age_days=1)
    document["reclaim"]["dry_run"] = False  # live: the controller writes nothing in dry-run
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(document))
    FakeSlurm.built = []
    monkeypatch.setattr("slurm_aigc.telemetry.learnpublish.uid_of", UIDS.get)
    monkeypatch.setattr(reclaim, "SlurmCli", FakeSlurm)
    monkeypatch.setattr("slurm_aigc.slurm.SlurmCli", FakeSlurm)
    return path


def unit_arguments() -> list[str]:
    """What the shipped controller unit passes after `slurm-aigc controller`."""
    [exec_start] = settings(CONTROLLER)["ExecStart"]
    argv = shlex.split(exec_start)
    return argv[argv.index("controller") + 1:]


class NoLoop:
    """`DaemonLoop` that does not loop: the command builds everything and returns."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def run(self, once: bool) -> int:
        return 0


def test_the_shipped_controller_unit_runs_the_learner(policy: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert "--no-publisher" in unit_arguments()  # the case the review found
    built: list[tuple[Any, Any]] = []
    original = reclaim._controller

    def spy(*args: Any, **kwargs: Any) -> Any:
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(reclaim, "_controller", spy)
    monkeypatch.setattr("slurm_aigc.daemonloop.DaemonLoop", NoLoop)
    argv = [*unit_arguments(), "--config", str(policy), "--db", f"sqlite:///{tmp_path / 'state.db'}"]
    result = CliRunner().invoke(reclaim.controller, argv)
    assert result.exit_code == 0, result.output
    [(_ctl, hooks, _leases)] = built
    assert hooks is not None, "no learner under the shipped unit"
    for _ in range(6):  # the loop's ticks: one sacct window each until the day is read
        hooks.tick(None, None)
    [entry] = parse_table((tmp_path / "learned.txt").read_bytes())
    assert entry.pattern == "sd-gen"
    # It asks sacct through the loop's own SlurmCli (the loop's timeout), not one of its own.
    assert len(FakeSlurm.built) == 1 and FakeSlurm.built[0].timeout_s is None and FakeSlurm.built[0].calls


def test_one_off_and_one_job_runs_do_not_learn(policy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []
    original = reclaim._controller

    def spy(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["learner"])
        return original(*args, **kwargs)

    monkeypatch.setattr(reclaim, "_controller", spy)
    monkeypatch.setattr("slurm_aigc.daemonloop.DaemonLoop", NoLoop)
    common = ["--config", str(policy), "--db", f"sqlite:///{tmp_path / 'state.db'}"]
    for extra in (["--once"], ["--job", "7"], []):
        assert CliRunner().invoke(reclaim.controller, [*common, *extra]).exit_code == 0
    assert asked == [False, False, True]  # like the retention: the daemon's, not a one-off's


def test_learned_update_reads_the_whole_range_with_the_reports_timeout(policy: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(learned, ["update", "--config", str(policy), "--db", f"sqlite:///{tmp_path / 's.db'}"])
    assert result.exit_code == 0, result.output
    [slurm] = FakeSlurm.built
    assert slurm.timeout_s == SACCT_TIMEOUT_S  # in the foreground nothing else waits on sacct
    assert len(slurm.calls) == 4 and "wrote 1 learned default(s)" in result.output  # a day: 4 windows, one run
