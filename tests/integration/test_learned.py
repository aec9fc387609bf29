"""Learned defaults on the real local cluster (issue 14.4): slurmctld's hook reads the learned table.

Installs the shipped policy with `learned.enabled` and a test-owned table, submits untagged jobs
as the test users, and at the end re-installs the plain shipped policy.
"""

from __future__ import annotations

import json
import pwd
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.tags import trusted_tags
from slurm_aigc.telemetry.learned import LearnedEntry, format_table, name_pattern
from tests.integration.helpers import hook_with_policy, submit, wait_job_state

pytestmark = pytest.mark.cluster

SLURM_AIGC = str(Path(sys.executable).with_name("slurm-aigc"))
NAME = "aigc-itest-gen-0042"  # key: aigc-itest-gen


def uid(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


@pytest.fixture(scope="module")
def learned_policy(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("learned")
    directory.chmod(0o755)
    table = directory / "learned-defaults.txt"
    table.write_bytes(format_table([LearnedEntry(uid("aigc-alice"), "aigc-alice", "aigc-itest-gen", "infer", 7, 0.3,
                                                 6, 6, 6000.0)]))
    table.chmod(0o644)
    document = yaml.safe_load(shipped_policy().read_text())
    document["learned"].update(enabled=True, file=str(table), refresh_seconds=0, max_entries=100)
    with hook_with_policy(cluster, document, directory / "policy.yaml") as policy_file:
        yield policy_file


def classify(policy: Path, *args: str) -> dict[str, Any]:
    result = subprocess.run([SLURM_AIGC, "classify", "--json", "--policy", str(policy), *args],
                            capture_output=True, text=True, check=True, timeout=60)
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_an_untagged_job_with_a_learned_entry_is_shared_and_stamped(cluster: Any, learned_policy: Path,
                                                                     jobs: list[str]) -> None:
    jobs.append(submit(cluster, "sleep 60\n", "--gres=gpu:1", f"--job-name={NAME}"))
    info = wait_job_state(cluster, jobs[0], "RUNNING", timeout_s=60)
    shards = re.search(r"\bshard:(\d+)\b", info.tres_per_node)
    assert shards is not None, info.tres_per_node
    assert trusted_tags(info.admin_comment) == {"class": "infer", "learned": "1"}, info.admin_comment
    predicted = classify(learned_policy, "--user", "aigc-alice", "--name", NAME, "--gres", "gpu:1")
    assert predicted["learned"]["key"] == {"uid": uid("aigc-alice"), "pattern": "aigc-itest-gen"}
    assert predicted["learned"]["entry"]["class"] == "infer" and predicted["learned"]["entry"]["jobs"] == 6
    assert predicted["changes"]["admin_comment"][1] == info.admin_comment
    assert predicted["changes"]["tres_per_node"][1].endswith(f"shard:{shards.group(1)}")


def test_the_entry_is_the_owners_only_and_a_typed_tag_wins(cluster: Any, learned_policy: Path, jobs: list[str]) -> None:
    jobs.append(submit(cluster, "sleep 60\n", "--gres=gpu:1", f"--job-name={NAME}", user="aigc-bob"))
    jobs.append(submit(cluster, "sleep 60\n", "--gres=gpu:1", f"--job-name={NAME}", "--comment=aigc:type=train"))
    bob, typed = (wait_job_state(cluster, job_id, "RUNNING", timeout_s=60) for job_id in jobs)
    assert trusted_tags(bob.admin_comment) == {"class": "unknown"} and "shard" not in bob.tres_per_node
    assert trusted_tags(typed.admin_comment) == {"class": "train"} and "shard" not in typed.tres_per_node


def test_a_hostile_name_is_plain_words_to_slurmctlds_hook_and_the_learner(cluster: Any, learned_policy: Path,
                                                                           jobs: list[str]) -> None:
    # Glob and Lua pattern characters, a newline and an upper-case mix: separators, never a
    # wildcard. The first name's words are the entry's key (plus a counter); the second would
    # match the key only if the key were read as a pattern.
    matching, pattern_like = "AIGC_itest*GEN?[\n0044]", "aigc-itest-.*"
    assert name_pattern(matching) == "aigc-itest-gen" and name_pattern(pattern_like) == "aigc-itest"
    jobs.append(submit(cluster, "sleep 60\n", "--gres=gpu:1", f"--job-name={matching}"))
    jobs.append(submit(cluster, "sleep 60\n", "--gres=gpu:1", f"--job-name={pattern_like}"))
    learned, plain = (wait_job_state(cluster, job_id, "RUNNING", timeout_s=60) for job_id in jobs)
    assert learned.name == matching, learned.name  # the name reached slurmctld whole
    assert trusted_tags(learned.admin_comment) == {"class": "infer", "learned": "1"}, learned.admin_comment
    assert "shard" in learned.tres_per_node, learned.tres_per_node
    assert trusted_tags(plain.admin_comment) == {"class": "unknown"}, plain.admin_comment
    assert "shard" not in plain.tres_per_node, plain.tres_per_node


def test_the_learner_reads_slurmdbd_windows_without_a_job(cluster: Any, cluster_db: str, tmp_path: Path) -> None:
    # 22.05's sacct --json answers a window without a job with "Nothing found" beside "jobs": [];
    # read as an error, the learner failed on its first empty window and retried it forever.
    # 30 days back: 120 windows of 6 h, the oldest before any job of this cluster.
    document = yaml.safe_load(shipped_policy().read_text())
    table = tmp_path / "learned.txt"
    document["learned"].update(enabled=True, file=str(table), max_age_days=30)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(document))
    result = subprocess.run([SLURM_AIGC, "learned", "update", "--config", str(policy), "--db", cluster_db],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert table.read_bytes().startswith(b"# slurm-aigc learned defaults")
