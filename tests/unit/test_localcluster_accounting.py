"""Accounting bring-up: what to add is decided from `sacctmgr -nP show` output, not add's wording."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_aigc.errors import ClusterError
from slurm_aigc.localcluster import manager
from slurm_aigc.localcluster.manager import LocalCluster, accounting_additions

# `sacctmgr -nP show assoc format=cluster,account,user where cluster=aigc` after a first bring-up,
# as printed by Slurm 22.05.8 (Debian 12) and 24.11.5 (Debian 13): the same parsable rows.
FULL_ASSOCS = "aigc|root|\naigc|root|root\naigc|aigc|\naigc|aigc|aigc-alice\naigc|aigc|aigc-bob\naigc|aigc|root\n"
# Right after `add cluster`: slurmdbd creates the root account and the root user's association.
NEW_CLUSTER_ASSOCS = "aigc|root|\naigc|root|root\n"


def adds(argvs: list[list[str]]) -> list[tuple[str, str]]:
    return [(argv[1], argv[2]) for argv in argvs]


def test_empty_database_adds_cluster_account_and_every_user() -> None:
    assert adds(accounting_additions("", "")) == [
        ("cluster", "aigc"), ("account", "aigc"), ("user", "aigc-alice"), ("user", "aigc-bob"), ("user", "root")]


def test_everything_present_adds_nothing() -> None:
    assert accounting_additions("aigc\n", FULL_ASSOCS) == []


def test_cluster_present_adds_account_and_users_only() -> None:
    assert adds(accounting_additions("aigc\n", NEW_CLUSTER_ASSOCS)) == [
        ("account", "aigc"), ("user", "aigc-alice"), ("user", "aigc-bob"), ("user", "root")]


def test_root_in_root_account_is_not_root_in_ours() -> None:
    partial = "aigc|root|root\naigc|aigc|\naigc|aigc|aigc-alice\n"
    assert adds(accounting_additions("other\naigc\n", partial)) == [("user", "aigc-bob"), ("user", "root")]


def test_other_clusters_do_not_count() -> None:
    other = FULL_ASSOCS.replace("aigc|", "prod|")
    assert adds(accounting_additions("prod\n", other))[0] == ("cluster", "aigc")
    assert len(accounting_additions("prod\n", other)) == 5


class FakeSacctmgr:
    """sacctmgr over an in-memory database; `add` of something present answers like 24.11 (exit 1)."""

    def __init__(self, *, apply_adds: bool = True) -> None:
        self.clusters: set[str] = set()
        self.assocs: set[tuple[str, str, str]] = set()
        self.apply_adds = apply_adds
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], **_: object) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        if argv[1] == "-nP" and argv[3] == "cluster":
            return self._done(argv, "".join(f"{c}\n" for c in sorted(self.clusters)))
        if argv[1] == "-nP":
            return self._done(argv, "".join(f"{c}|{a}|{u}\n" for c, a, u in sorted(self.assocs)))
        return self._add(argv)

    def _add(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        kind, name = argv[3], argv[4]
        options = dict(arg.split("=", 1) for arg in argv[5:])
        row = {"cluster": None, "account": ("aigc", name, ""), "user": ("aigc", options.get("account", ""), name)}[kind]
        if (kind == "cluster" and name in self.clusters) or row in self.assocs:
            message = "Already existing account aigc on cluster aigc" if kind == "account" else "Nothing added."
            return subprocess.CompletedProcess(argv, 1, "", f" {message}\n")
        if self.apply_adds:
            if kind == "cluster":
                self.clusters.add(name)
                self.assocs |= {(name, "root", ""), (name, "root", "root")}
            elif row is not None:
                self.assocs.add(row)
        return self._done(argv, " Adding ...\n")

    @staticmethod
    def _done(argv: list[str], out: str) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_bring_up_twice_with_24_11_wording(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeSacctmgr()
    monkeypatch.setattr(manager, "_run", fake)
    cluster = LocalCluster(tmp_path, tmp_path)
    cluster._ensure_accounting()
    assert ("aigc", "aigc", "aigc-bob") in fake.assocs and "aigc" in fake.clusters
    fake.calls.clear()
    cluster._ensure_accounting()
    assert [argv[1] for argv in fake.calls] == ["-nP", "-nP", "-nP", "-nP"]  # two listings, no add


def test_an_add_that_did_not_take_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(manager, "_run", FakeSacctmgr(apply_adds=False))
    with pytest.raises(ClusterError, match="could not add: add cluster aigc; add account aigc"):
        LocalCluster(tmp_path, tmp_path)._ensure_accounting()
