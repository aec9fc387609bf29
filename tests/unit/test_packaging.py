"""A wheel install is complete: it ships the hook, the default policy and the systemd units.

`shipped_file` finds them in the source checkout first, then in the package's data/ (where
setuptools puts the targets of the slurm_aigc/data/ symlinks). The wheel test builds from a
copy of the source tree (so no build/ or egg-info lands in the checkout), installs with
`pip --target` and asks a fresh interpreter, outside the repository, where the files are.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_aigc.cli.shipped import shipped
from slurm_aigc.errors import ShippedFileError
from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.render import render_hook
from slurm_aigc.shipped import AGENT_UNIT, POLICY, SHIPPED, shipped_file

REPO = Path(__file__).resolve().parents[2]
SHIPPED_DIRS = ("etc", "job_submit_lua", "daemon")
# What setuptools reads to build the wheel; copied, symlinks kept, into a scratch tree.
BUILD_INPUTS = ("pyproject.toml", "setup.cfg", "README.md", "slurm_aigc", *SHIPPED_DIRS)
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def fake_install(root: Path, *, checkout: bool, in_checkout: str = "", in_data: str = "") -> Path:
    """root/slurm_aigc with POLICY written where asked; setup.cfg beside it when `checkout`."""
    package = root / "slurm_aigc"
    package.mkdir(parents=True)
    if checkout:
        (root / "setup.cfg").write_text("[metadata]\n")
    for base, text in ((root, in_checkout), (package / "data", in_data)):
        if text:
            (base / POLICY).parent.mkdir(parents=True, exist_ok=True)
            (base / POLICY).write_text(text)
    return package


def test_checkout_wins_over_package_data(tmp_path: Path) -> None:
    package = fake_install(tmp_path, checkout=True, in_checkout="tree", in_data="data")
    assert shipped_file(POLICY, package) == tmp_path / POLICY


def test_installed_package_data_is_found(tmp_path: Path) -> None:
    package = fake_install(tmp_path, checkout=False, in_data="data")
    assert shipped_file(POLICY, package).read_text() == "data"


def test_a_stray_etc_beside_site_packages_is_not_a_checkout(tmp_path: Path) -> None:
    package = fake_install(tmp_path, checkout=False, in_checkout="stray", in_data="data")
    assert shipped_file(POLICY, package).read_text() == "data"


def test_missing_file_names_every_place_looked(tmp_path: Path) -> None:
    package = fake_install(tmp_path, checkout=True)
    with pytest.raises(ShippedFileError) as error:
        shipped_file(POLICY, package)
    assert str(tmp_path / POLICY) in str(error.value)
    assert str(package / "data" / POLICY) in str(error.value)


def test_every_file_of_the_shipped_dirs_is_listed_and_reachable_through_data() -> None:
    on_disk = {str(p.relative_to(REPO)) for d in SHIPPED_DIRS for p in (REPO / d).iterdir() if p.is_file()}
    assert on_disk == set(SHIPPED)
    for name in SHIPPED:
        data = REPO / "slurm_aigc" / "data" / name
        assert data.resolve() == (REPO / name).resolve(), f"slurm_aigc/data/{name} must be a symlink into the tree"
        assert shipped_file(name) == REPO / name


def test_shipped_command_lists_and_prints_paths() -> None:
    listing = CliRunner().invoke(shipped, [])
    assert listing.exit_code == 0, listing.output
    assert [line.split()[0] for line in listing.output.splitlines()] == list(SHIPPED)
    one = CliRunner().invoke(shipped, [AGENT_UNIT])
    assert one.exit_code == 0 and one.output == f"{REPO / AGENT_UNIT}\n"


def _version(distribution: str) -> tuple[int, ...] | None:
    """The installed version's leading numbers, read from metadata (importing setuptools here would
    let its distutils shim fight the one already loaded)."""
    try:
        text = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def _cannot_build_wheels() -> str | None:
    """None when this interpreter can build a wheel offline, else why not."""
    for needed in ("pip", "setuptools"):
        if _version(needed) is None:
            return f"{needed} is not installed in this interpreter"
    if _version("wheel") is None and (_version("setuptools") or ()) < (70, 1):
        return "no bdist_wheel: install `wheel` (it is in the test extras) or setuptools>=70.1"
    return None


def source_copy(tmp_path: Path) -> Path:
    """What setuptools reads, copied (symlinks kept) to tmp_path/src."""
    tree = tmp_path / "src"
    for name in BUILD_INPUTS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, tree / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            tree.mkdir(exist_ok=True)
            shutil.copy2(source, tree / name)
    return tree


def build_wheel(tmp_path: Path) -> Path:
    tree = source_copy(tmp_path)
    out = tmp_path / "wheelhouse"
    argv = [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out), str(tree)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("slurm_aigc-*.whl")
    return wheel


# Run by a fresh interpreter with PYTHONPATH=<target>: where does the installed package find things?
PROBE = """
import json, slurm_aigc
from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.policy.render import lua_dir, render_hook
from slurm_aigc.shipped import SHIPPED, shipped_file
print(json.dumps({"package": slurm_aigc.__file__, "policy": str(shipped_policy()), "lua_dir": str(lua_dir()),
                  "files": {n: str(shipped_file(n)) for n in SHIPPED},
                  "rendered": render_hook(load_policy(shipped_policy()))}))
"""


def test_wheel_ships_the_hook_policy_and_units_and_an_install_finds_them(tmp_path: Path) -> None:
    reason = _cannot_build_wheels()
    if reason:
        pytest.skip(f"cannot build a wheel offline: {reason}")
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        for name in SHIPPED:
            assert archive.read(f"slurm_aigc/data/{name}") == (REPO / name).read_bytes(), name
        assert code_in_package_for_tests(archive.namelist()) == []
    target = tmp_path / "target"
    argv = [*PIP, "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("SLURM_AIGC_CONFIG", None)
    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    installed = target.resolve()
    assert Path(found["package"]).resolve().is_relative_to(installed)
    for name, path in found["files"].items():
        assert Path(path).resolve().is_relative_to(installed), (name, path)
        assert Path(path).read_bytes() == (REPO / name).read_bytes(), name
    assert Path(found["policy"]) == Path(found["files"][POLICY])
    assert Path(found["lua_dir"]).resolve().is_relative_to(installed)
    assert found["rendered"] == render_hook(load_policy(REPO / POLICY)).replace(str(REPO / POLICY), found["policy"])


# Fakes of the boundaries and test switches live under tests/ (issue 15.4), never in the package.
_TEST_ONLY = re.compile(r"(^|/)(fakes|[a-z_]*_fakes|pynvml)\.py$|^tests/")


def code_in_package_for_tests(names: list[str]) -> list[str]:
    """The archive members below the package that are test code (a fake, a stub pynvml)."""
    return [name for name in names if "slurm_aigc/" in name and _TEST_ONLY.search(name.split("slurm_aigc/", 1)[1])]


def test_a_fakes_module_anywhere_in_the_package_counts_as_test_code() -> None:
    names = ["slurm_aigc/telemetry/fakes.py", "slurm-aigc-1/slurm_aigc/reclaim/fakes.py", "slurm_aigc/tests/x.py",
             "slurm_aigc/telemetry/nvml.py", "slurm-aigc-1/tests/fakes/nvml.py", "slurm_aigc/report/figures.py"]
    assert code_in_package_for_tests(names) == names[:3]


def test_sdist_package_holds_no_fakes(tmp_path: Path) -> None:
    reason = _cannot_build_wheels()
    if reason:
        pytest.skip(f"cannot build an sdist offline: {reason}")
    tree, out = source_copy(tmp_path), tmp_path / "dist"
    build = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", build, str(out)], cwd=tree, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(out / done.stdout.strip().splitlines()[-1]) as archive:
        names = archive.getnames()
    assert any(name.endswith("slurm_aigc/telemetry/nvml.py") for name in names)
    assert code_in_package_for_tests(names) == []
