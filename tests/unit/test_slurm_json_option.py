"""Which `--json` the Slurm boundary passes per Slurm version (docs/slurm-boundary.md, finding 4).

25.05+ answer a bare `--json` in their newest data_parser (v0.0.43 ...); the boundary asks for
v0.0.42 there, the shape 24.11 prints by default and CI reads. 22.05 (no data_parser) and 24.11
keep the bare option; 26.11 ships no v0.0.42, so it gets the bare option and a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from slurm_aigc.slurm import CommandResult, SlurmCli

EMPTY_JOBS = '{"jobs": [], "errors": []}'
EMPTY_NODES = '{"nodes": [], "errors": []}'


class Recorder:
    """Answers `scontrol --version` with `version_text`, anything else with an empty listing."""

    def __init__(self, version_text: str) -> None:
        self.version_text = version_text
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        self.calls.append(tuple(argv))
        if tuple(argv) == ("scontrol", "--version"):
            return CommandResult(tuple(argv), 0, self.version_text, "")
        return CommandResult(tuple(argv), 0, EMPTY_NODES if "node" in argv else EMPTY_JOBS, "")


@pytest.mark.parametrize(("version", "option"), [
    ("slurm-wlm 22.05.8", "--json"),      # openapi v0.0.38, no data_parser plugins
    ("slurm 23.11.10", "--json"),
    ("slurm-wlm 24.11.5", "--json"),      # default v0.0.42: the tested shape already
    ("slurm 25.05.0", "--json=v0.0.42"),  # default v0.0.43
    ("slurm 25.11.2", "--json=v0.0.42"),
    ("slurm 26.05.1", "--json=v0.0.42"),  # ships v0.0.42-v0.0.45
    ("slurm 26.11.0", "--json"),          # v0.0.42 removed
])
def test_json_option_per_version(version: str, option: str) -> None:
    assert SlurmCli(Recorder(version)).json_option() == option


def test_every_json_read_of_a_25_05_boundary_is_pinned() -> None:
    runner = Recorder("slurm 25.05.3")
    slurm = SlurmCli(runner)
    assert slurm.jobs() == [] and slurm.job("7") is None and slurm.nodes() == []
    slurm.run("sacct", ["--allocations", "--json", "--starttime=2026-12-01T00:00:00"])
    assert runner.calls == [
        ("scontrol", "--version"),  # asked once, then kept
        ("scontrol", "-d", "--json=v0.0.42", "show", "job"),
        ("scontrol", "-d", "--json=v0.0.42", "show", "job", "7"),
        ("scontrol", "-d", "--json=v0.0.42", "show", "node"),
        ("sacct", "--allocations", "--json=v0.0.42", "--starttime=2026-12-01T00:00:00"),
    ]


def test_22_05_and_24_11_keep_the_bare_option() -> None:
    for version, job_argv in (((22, 5, 8), ("squeue", "--json")), ((24, 11, 5), ("scontrol", "-d", "--json", "show", "job"))):
        runner = Recorder("unused")
        slurm = SlurmCli(runner, slurm_version=version)
        slurm.jobs()
        slurm.run("sacct", ["--json"])
        assert runner.calls == [job_argv, ("sacct", "--json")]


def test_calls_without_json_never_ask_the_version() -> None:
    runner = Recorder("slurm 25.05.3")
    SlurmCli(runner).run("scontrol", ["update", "NodeName=a100-01", "Weight=5"])
    SlurmCli(runner).run("sacctmgr", ["-nP", "show", "cluster", "--json"])  # not a data_parser reader of ours
    assert runner.calls == [("scontrol", "update", "NodeName=a100-01", "Weight=5"),
                            ("sacctmgr", "-nP", "show", "cluster", "--json")]


def test_a_release_without_v0_0_42_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    slurm = SlurmCli(Recorder("slurm 26.11.0"))
    with caplog.at_level(logging.WARNING, logger="slurm_aigc.slurm"):
        slurm.jobs()
        slurm.jobs()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "26.11 has no data_parser v0.0.42" in warnings[0]
