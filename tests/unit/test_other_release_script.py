"""scripts/other-release.sh: which release to build and from which mirror (its pure functions)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "other-release.sh"

DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""
ONE_LINE = "deb http://mirror.example/debian-security trixie-security main\ndeb http://mirror.example/debian trixie main\n"


def call(tmp_path: Path, function: str, *args: str, version: str = "12.11\n") -> subprocess.CompletedProcess[str]:
    (tmp_path / "debian_version").write_text(version)
    env = dict(os.environ, APT_ETC=str(tmp_path / "apt"), DEBIAN_VERSION_FILE=str(tmp_path / "debian_version"))
    command = f'source "{SCRIPT}" --functions-only && {function} "$@"'
    return subprocess.run(["bash", "-c", command, "test", *args], env=env, capture_output=True, text=True,
                          timeout=30, check=False)


def sources(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / "apt" / "sources.list.d").mkdir(parents=True, exist_ok=True)
    (tmp_path / "apt" / name).write_text(text)


@pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run without root")
@pytest.mark.parametrize(("version", "release"), [("12.11\n", "bookworm"), ("13.8\n", "trixie")])
def test_host_release_from_debian_version(tmp_path: Path, version: str, release: str) -> None:
    assert call(tmp_path, "host_release", version=version).stdout.strip() == release


@pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run without root")
def test_other_debian_is_refused_naming_the_file(tmp_path: Path) -> None:
    done = call(tmp_path, "host_release", version="trixie/sid\n")
    assert done.returncode == 2 and "not Debian 12 or 13" in done.stderr and "trixie/sid" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run without root")
def test_mirror_from_deb822_sources_skips_the_security_archive(tmp_path: Path) -> None:
    sources(tmp_path, "sources.list.d/debian.sources", DEB822)
    assert call(tmp_path, "debian_mirror", "bookworm").stdout.strip() == "http://deb.debian.org/debian"


@pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run without root")
def test_mirror_from_one_line_sources_list(tmp_path: Path) -> None:
    sources(tmp_path, "sources.list", ONE_LINE)
    assert call(tmp_path, "debian_mirror", "trixie").stdout.strip() == "http://mirror.example/debian"


@pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run without root")
def test_no_mirror_for_the_release_fails_loudly(tmp_path: Path) -> None:
    sources(tmp_path, "sources.list.d/debian.sources", DEB822)
    done = call(tmp_path, "debian_mirror", "trixie")
    assert done.returncode == 2 and "no Debian mirror for trixie" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run without root")
@pytest.mark.parametrize(("args", "command"), [
    ((), "bash scripts/test.sh"),
    (("tests/integration/test_publisher.py", "-k", "agent daemon"), "bash scripts/test.sh tests/integration/test_publisher.py -k agent\\ daemon"),
    (("--demo",), "bash scripts/demo.sh --out-dir /var/tmp/aigc-results/demo-out"),
    (("--demo", "--minutes", "1", "--cleanup"), "bash scripts/demo.sh --out-dir /var/tmp/aigc-results/demo-out --minutes 1 --cleanup"),
    (("--run", "sinfo; sacct -X"), "sinfo; sacct -X"),
])
def test_the_command_run_in_the_chroot(tmp_path: Path, args: tuple[str, ...], command: str) -> None:
    done = call(tmp_path, "inner_command", *args)
    assert done.returncode == 0 and done.stdout == command + "\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run without root")
@pytest.mark.parametrize("args", [("--run",), ("--run", ""), ("--run", "sinfo", "squeue")])
def test_run_takes_exactly_one_command(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = call(tmp_path, "inner_command", *args)
    assert done.returncode == 2 and "--run takes exactly one command" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run without root")
def test_a_bad_run_is_refused_before_any_chroot_work(tmp_path: Path) -> None:
    (tmp_path / "debian_version").write_text("12.11\n")
    env = dict(os.environ, APT_ETC=str(tmp_path / "apt"), DEBIAN_VERSION_FILE=str(tmp_path / "debian_version"),
               SLURM_AIGC_CHROOT_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(["bash", str(SCRIPT), "--run"], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and "--run takes exactly one command" in done.stderr
    assert not (tmp_path / "cache").exists()  # nothing built, nothing mounted
