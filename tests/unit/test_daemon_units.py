"""The shipped systemd units: least privilege, private state, no shared StateDirectory (issue 12.13)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_aigc.policy.model import LearnedConfig, ModelPreferRule

UNITS = Path(__file__).resolve().parents[2] / "daemon"
AGENT, CONTROLLER = UNITS / "slurm-aigc-agent.service", UNITS / "slurm-aigc-controller.service"


def settings(unit: Path) -> dict[str, list[str]]:
    """`[Service]` key -> every value it is given (systemd allows repeating a key)."""
    found: dict[str, list[str]] = {}
    section = ""
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif line and not line.startswith("#") and "=" in line and section == "Service":
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_units_with_different_users_do_not_share_a_state_directory() -> None:
    agent, controller = settings(AGENT), settings(CONTROLLER)
    assert agent["User"] != controller["User"]
    assert not set(agent["StateDirectory"]) & set(controller["StateDirectory"])
    assert agent["StateDirectoryMode"] == ["0700"]
    for unit in (agent, controller):
        assert "ReadWritePaths" not in unit  # only its own StateDirectory is writable


def test_slurmctld_can_open_the_files_the_controller_writes_for_the_hook() -> None:
    # The defaults of the two files the hook reads lie in the controller's StateDirectory; the
    # hook runs as SlurmUser, another user, so the directory must be searchable by others.
    controller = settings(CONTROLLER)
    [state_dir] = controller["StateDirectory"]
    for path in (ModelPreferRule().published_features_file, LearnedConfig().file):
        assert path is not None and Path(path).parent == Path("/var/lib") / state_dir
    mode = int(controller["StateDirectoryMode"][-1], 8)
    assert mode & 0o001 and not mode & 0o006  # others may open a file by name, not list or write
    assert controller["UMask"] == ["0077"]  # ... and the database file stays private


@pytest.mark.parametrize("unit", [AGENT, CONTROLLER], ids=lambda p: p.stem)
def test_units_are_hardened(unit: Path) -> None:
    found = settings(unit)
    expected = {"UMask": "0077", "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                "PrivateTmp": "yes", "CapabilityBoundingSet": "", "RestrictSUIDSGID": "yes",
                "SystemCallFilter": "@system-service", "LockPersonality": "yes"}
    assert {key: found.get(key, ["<missing>"])[-1] for key in expected} == expected


def test_controller_sees_no_other_process() -> None:
    assert settings(CONTROLLER)["ProtectProc"] == ["invisible"]
    assert settings(AGENT)["ProtectProc"] == ["default"]  # attribution reads other users' /proc/<pid>


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("unit", [AGENT, CONTROLLER], ids=lambda p: p.stem)
def test_systemd_accepts_the_unit(unit: Path, tmp_path: Path) -> None:
    # The binary is not installed here: verify the unit with a command that exists.
    copy = tmp_path / unit.name
    copy.write_text("\n".join("ExecStart=/bin/true" if line.startswith("ExecStart=") else line
                              for line in unit.read_text().splitlines()) + "\n")
    done = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
