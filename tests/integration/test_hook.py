"""The job_submit hook on the real local cluster: every default rewrite, fail-open, classify agreement.

The module installs the shipped policy (with a test-owned published-features file) into the
cluster's Slurm config dir, and at the end re-installs the plain shipped policy, which the
demo and the other tests expect.
"""

from __future__ import annotations

import json
import pwd
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_aigc.policy.hookruntime import NICE_OFFSET
from slurm_aigc.policy.install import HOOK_FILE, atomic_write, install_hook
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.slurm import JobInfo
from slurm_aigc.tags import trusted_class, trusted_opt_out
from tests.integration.helpers import gpu_indices_of_job, hook_with_policy, submit, wait_for, wait_job_state

pytestmark = pytest.mark.cluster

SLURM_AIGC = str(Path(sys.executable).with_name("slurm-aigc"))
SLEEP = "sleep 60\n"
MODEL = "aigc-itest-model"


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("published")
    directory.chmod(0o755)
    path = directory / "published-features.txt"
    path.write_text("")
    path.chmod(0o644)
    return path


@pytest.fixture(scope="module")
def hook_installed(cluster: Any, published: Path) -> Iterator[Path]:
    document = yaml.safe_load(shipped_policy().read_text())
    document["rewrites"]["model_prefer"]["published_features_file"] = str(published)
    document["rewrites"]["model_prefer"]["refresh_seconds"] = 0
    document["classes"]["imagegen"]["time_minutes"] = 90
    document["rewrites"]["shard"]["nice"] = -100  # off by default; on here, so slurmctld's use of it is tested
    with hook_with_policy(cluster, document, published.parent / "policy.yaml") as policy_file:
        yield policy_file


def alice_uid() -> int:
    return pwd.getpwnam("aigc-alice").pw_uid


def job(cluster: Any, job_id: str) -> JobInfo:
    info = cluster.slurm.job(job_id)
    assert info is not None, f"job {job_id} vanished"
    return info  # type: ignore[no-any-return]


def node_type(node_list: str) -> str:
    return node_list.split("-", 1)[0]


def classify(*args: str, uid: int) -> dict[str, Any]:
    """`slurm-aigc classify --json` against the hook installed in the cluster (the default)."""
    result = subprocess.run([SLURM_AIGC, "classify", "--json", "--user-id", str(uid), *args],
                            capture_output=True, text=True, check=True, timeout=60)
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _gres(text: str | None) -> str:
    """`gres:shard:20` / `gres/shard:20` / `shard:20` -> `shard:20` (22.05 Lua vs scontrol spelling)."""
    entries = [e[len("gres:"):] if e.startswith(("gres:", "gres/")) else e for e in (text or "").split(",") if e]
    return ",".join(entries)


def _text(text: str | None) -> str:
    value = (text or "").strip()
    return "" if value == "(null)" else value


def slurmctld_nice(job_id: str) -> int:
    """The job's nice as job_desc holds it (+ NICE_OFFSET): `squeue --json` of 22.05 has no nice."""
    shown = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%y"], capture_output=True, text=True, check=True,
                           timeout=30).stdout
    return int(shown) + NICE_OFFSET


# Every job_desc field the hook may write (docs/hook.md), read back from slurmctld.
SLURMCTLD_VALUE: dict[str, Callable[[JobInfo], object]] = {
    "nice": lambda info: slurmctld_nice(info.job_id),
    "partition": lambda info: info.partition,
    "qos": lambda info: info.qos,
    "time_limit": lambda info: None if info.time_limit_s is None else info.time_limit_s // 60,
    "tres_per_node": lambda info: _gres(info.tres_per_node),
    "tres_per_job": lambda info: _gres(_text(info.fields.get("TresPerJob"))),
    "features": lambda info: _text(info.features),
    "prefer": lambda info: _text(info.fields.get("Prefer")),
    "comment": lambda info: _text(info.comment),
    "admin_comment": lambda info: _text(info.admin_comment),
}
NORMALISE: dict[str, Callable[[str | None], str]] = {"tres_per_node": _gres, "tres_per_job": _gres}


def assert_classify_agrees(info: JobInfo, predicted: dict[str, Any], submitted: dict[str, str | None]) -> None:
    """Every field classify changed is what slurmctld holds; every field it left is as submitted."""
    unknown = set(predicted["changes"]) - set(SLURMCTLD_VALUE)
    assert not unknown, f"classify changed fields this test cannot read back: {unknown}"
    for field, read in SLURMCTLD_VALUE.items():
        if field in predicted["changes"]:
            expected = predicted["changes"][field][1]
        elif field in submitted:
            expected = submitted[field]
        else:
            continue
        expected = NORMALISE.get(field, _text)(expected) if not isinstance(expected, int) else expected
        assert read(info) == expected, f"{field}: classify said {expected!r}, slurmctld has {read(info)!r}"


def test_small_inference_runs_on_shards_of_a_gpu_that_fits(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    comment = "exp42 aigc:type=infer,vram=20G"
    jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", f"--comment={comment}"))
    info = wait_job_state(cluster, jobs[0], "RUNNING", timeout_s=60)
    assert re.search(r"\bshard:40\b", info.tres_per_node), info.tres_per_node  # infer's SM share: half an a100
    assert info.features == "a100" and node_type(info.node_list) == "a100"
    assert info.comment.strip() == comment and info.admin_comment == "aigc_class=infer"
    assert_classify_agrees(info, classify("--comment", comment, "--gres", "gpu:1", uid=alice_uid()),
                           {"comment": comment, "prefer": None, "tres_per_job": None})


def test_a_shard_job_goes_ahead_of_an_earlier_whole_gpu_job(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    later = ("--begin=now+3600",)  # pending, with the priority slurmctld gave each at submit
    jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", "--comment=aigc:type=train", *later))
    comment = "aigc:type=infer,vram=6G"
    jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", f"--comment={comment}", *later))
    whole, shard = job(cluster, jobs[0]), job(cluster, jobs[1])
    assert slurmctld_nice(jobs[0]) == NICE_OFFSET and slurmctld_nice(jobs[1]) == NICE_OFFSET - 100
    assert int(shard.fields["Priority"]) > int(whole.fields["Priority"])  # submitted later, yet ahead
    assert_classify_agrees(shard, classify("--comment", comment, "--gres", "gpu:1", uid=alice_uid()),
                           {"comment": comment, "prefer": None, "tres_per_job": None})


def test_vram_that_does_not_fit_keeps_job_off_small_gpus(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    comment = "aigc:type=infer,vram=40G,share=no"
    jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", f"--comment={comment}"))
    info = wait_job_state(cluster, jobs[0], "RUNNING", timeout_s=60)
    assert info.features == "a100" and re.search(r"gpu:1$", info.tres_per_node)
    assert node_type(info.node_list) == "a100"
    assert_classify_agrees(info, classify("--comment", comment, "--gres", "gpu:1", uid=alice_uid()),
                           {"comment": comment, "tres_per_node": "gpu:1", "prefer": None})


def test_small_vram_may_use_a_t4(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    # imagegen is compute-bound (expected SM 0.9 > max_sm): a whole GPU, which a t4 can be.
    comment = "aigc:type=imagegen,vram=6G"
    jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", f"--comment={comment}", "--exclude=" + ",".join(cluster.nodes_of_type("a100"))))
    info = wait_job_state(cluster, jobs[0], "RUNNING", timeout_s=60)
    assert re.search(r"gpu:1$", info.tres_per_node) and node_type(info.node_list) == "t4"
    assert info.time_limit_s == 90 * 60  # imagegen's class default in this test policy


def test_shared_jobs_per_gpu_are_capped_by_their_expected_sm(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    # Packed by VRAM alone, five 3 GiB jobs fit one t4 (16 shards), and 11 7 GiB jobs shared an
    # a100 in the saturated benchmark, overrunning their limits; infer's SM share (0.5) allows two.
    node = cluster.nodes_of_type("t4")[0]
    comment = "aigc:type=infer,vram=3G"
    for _ in range(3):
        jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", f"--comment={comment}", f"--nodelist={node}"))
    running = [wait_job_state(cluster, job_id, "RUNNING", timeout_s=60) for job_id in jobs]
    per_gpu: dict[int, int] = {}
    for info in running:
        assert re.search(r"\bshard:8\b", info.tres_per_node) and info.features == "t4", info.tres_per_node
        for index in gpu_indices_of_job(info):
            per_gpu[index] = per_gpu.get(index, 0) + 1
    assert max(per_gpu.values()) <= 2 and sum(per_gpu.values()) == 3, per_gpu


def test_multi_gpu_training_is_kept_on_nvlink_nodes(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    comment = "aigc:type=train,model=none"
    jobs.append(submit(cluster, SLEEP, "--gres=gpu:4", "-N1", f"--comment={comment}"))
    info = wait_job_state(cluster, jobs[0], "RUNNING", timeout_s=60)
    assert info.features == "a100" and node_type(info.node_list) == "a100"
    assert_classify_agrees(info, classify("--comment", comment, "--gres", "gpu:4", "--nodes", "1", uid=alice_uid()),
                           {"comment": comment, "tres_per_node": "gpu:4", "prefer": None, "tres_per_job": None})


def test_model_prefers_nodes_publishing_it(cluster: Any, hook_installed: Path, published: Path, jobs: list[str]) -> None:
    serving = cluster.nodes_of_type("a100")[-1]
    node = cluster.slurm.node(serving)
    features = [f for f in node.available_features if f] + [f"model_{MODEL}"]
    cluster.slurm.update_node(serving, features=features)
    # As the publisher writes it: a fresh header, then the model and the serving node's other features.
    published.write_text(f"# written {int(time.time())}\nmodel_{MODEL} {' '.join(features[:-1])}\n")
    try:
        comment = f"aigc:type=infer,model={MODEL},vram=20G"
        jobs.append(submit(cluster, SLEEP, "--hold", "--gres=gpu:1", f"--comment={comment}"))
        held = job(cluster, jobs[0])
        # The preference repeats the shard rule's a100 constraint (22.05 tries it instead of it).
        assert held.fields.get("Prefer") == f"a100&model_{MODEL}" and held.features == "a100"
        assert_classify_agrees(held, classify("--comment", comment, "--gres", "gpu:1", uid=alice_uid()),
                               {"comment": comment})
        cluster.slurm.release(jobs[0])
        info = wait_job_state(cluster, jobs[0], "RUNNING", timeout_s=60)
        assert info.node_list == serving
    finally:
        published.write_text("")
        cluster.slurm.update_node(serving, features=[f for f in node.available_features if f])
    # Unpublished model: no --prefer, so Slurm does not reject the job for an unknown feature.
    jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", "--comment=aigc:type=infer,model=nobody-serves-this"))
    assert job(cluster, jobs[-1]).fields.get("Prefer", "(null)") == "(null)"


def test_root_and_untagged_jobs_are_unchanged(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", "--comment=aigc:type=infer,vram=20G", user=None))
    jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", "--comment=just my notes"))
    for job_id, comment in zip(jobs, ["aigc:type=infer,vram=20G", "just my notes"], strict=True):
        info = job(cluster, job_id)
        assert re.search(r"gpu:1$", info.tres_per_node) and info.features in ("", "(null)")
        assert info.comment.strip() == comment
    assert job(cluster, jobs[0]).admin_comment == "aigc_class=infer"  # root's jobs are only stamped
    assert job(cluster, jobs[1]).admin_comment == "aigc_class=unknown"  # only stamped
    predicted = classify("--comment", "just my notes", "--gres", "gpu:1", uid=alice_uid())
    assert set(predicted["changes"]) == {"admin_comment"}
    assert_classify_agrees(job(cluster, jobs[1]), predicted, {"comment": "just my notes", "tres_per_node": "gpu:1",
                                                               "features": None, "prefer": None})


def test_update_of_a_pending_job_is_rewritten_too(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    jobs.append(submit(cluster, SLEEP, "--hold", "--gres=gpu:1"))
    subprocess.run(["su", "aigc-alice", "-s", "/bin/sh", "-c",
                    f"scontrol update JobId={jobs[0]} Comment=aigc:type=infer,vram=40G"], check=True, timeout=30)
    info = job(cluster, jobs[0])
    assert info.features == "a100" and info.comment.strip() == "aigc:type=infer,vram=40G"
    # The class stays the one stamped at submit: an owner's update cannot re-class the job.
    assert info.admin_comment == "aigc_class=unknown"


def as_alice(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["su", "aigc-alice", "-s", "/bin/sh", "-c", command], capture_output=True, text=True, timeout=30)


def test_the_trusted_class_is_one_its_owner_cannot_write(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    forged = "aigc:type=train,reclaim=no aigc_class=interactive"
    jobs.append(submit(cluster, SLEEP, "--hold", "--gres=gpu:1", f"--comment={forged}"))
    info = job(cluster, jobs[0])
    assert info.admin_comment == "aigc_class=train aigc_reclaim=no"
    assert info.comment.strip() == "aigc:type=train,reclaim=no"  # the forged stamp word is dropped
    # sbatch has no option for it, and `scontrol update AdminComment=` by the owner is refused.
    denied = as_alice(f"scontrol update JobId={jobs[0]} AdminComment=aigc_class=interactive")
    assert denied.returncode != 0 and "denied" in (denied.stderr + denied.stdout).lower()
    assert as_alice("sbatch --admin-comment=aigc_class=interactive --hold --wrap true").returncode != 0
    # The owner may rewrite the comment at will: the trusted class does not move.
    assert as_alice(f"scontrol update JobId={jobs[0]} Comment='aigc_class=interactive aigc:type=interactive'").returncode == 0
    info = job(cluster, jobs[0])
    assert trusted_class(info.admin_comment) == "train" and trusted_opt_out(info.admin_comment)
    assert "aigc_class" not in info.comment
    # An admin's own AdminComment keeps the stamp in front (keep_stamp in the hook).
    cluster.slurm.update_job(jobs[0], AdminComment="site note")
    assert job(cluster, jobs[0]).admin_comment == "aigc_class=train aigc_reclaim=no; site note"


def test_a_signal_tag_is_stamped_and_only_the_tag_declares_it(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    """job_submit/lua cannot see --signal: the owner's `aigc:signal=` is stamped at submit, read back as slurmctld keeps it."""
    jobs.append(submit(cluster, SLEEP, "--hold", "--gres=gpu:1", "--comment=aigc:signal=B.USR1"))
    jobs.append(submit(cluster, SLEEP, "--hold", "--gres=gpu:1", "--comment=aigc:type=train aigc_signal=B.USR1"))
    jobs.append(submit(cluster, SLEEP, "--hold", "--gres=gpu:1", "--comment=aigc:type=train,signal=TERM"))
    declared, written, refused = (job(cluster, job_id) for job_id in jobs)
    assert declared.admin_comment == "aigc_class=unknown aigc_signal=B.USR1"  # squeue --json
    shown = subprocess.run(["scontrol", "show", "job", jobs[0]], capture_output=True, text=True, timeout=30, check=True)
    # 22.05 ends the line after it; 24.11 may print another field after a space.
    assert re.search(r"AdminComment=aigc_class=unknown aigc_signal=B\.USR1(\s|$)", shown.stdout), shown.stdout
    # A stamp word in the comment declares nothing (and is dropped); a terminating signal is a tag error.
    assert written.admin_comment == "aigc_class=train" and written.comment.strip() == "aigc:type=train"
    assert refused.admin_comment == "aigc_class=train"
    # The owner cannot declare it after submit: a re-tag leaves the stamp, an AdminComment update is refused.
    assert as_alice(f"scontrol update JobId={jobs[1]} Comment=aigc:type=train,signal=B.USR1").returncode == 0
    assert job(cluster, jobs[1]).admin_comment == "aigc_class=train"
    denied = as_alice(f"scontrol update JobId={jobs[1]} AdminComment='aigc_class=train aigc_signal=B.USR1'")
    assert denied.returncode != 0 and job(cluster, jobs[1]).admin_comment == "aigc_class=train"


def test_a_comment_only_update_keeps_the_time_limit(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    # imagegen's class default is 90 minutes in this policy; the job asked for 30.
    jobs.append(submit(cluster, SLEEP, "--hold", "--time=30", "--comment=aigc:type=imagegen,share=no"))
    assert job(cluster, jobs[0]).time_limit_s == 30 * 60
    assert as_alice(f"scontrol update JobId={jobs[0]} Comment=aigc:type=imagegen,share=no,model=x").returncode == 0
    info = job(cluster, jobs[0])
    assert info.comment.strip() == "aigc:type=imagegen,share=no,model=x" and info.time_limit_s == 30 * 60


def test_a_hook_that_raises_lets_jobs_through_unchanged(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    good = (cluster.etc_dir / HOOK_FILE).read_text()
    broken = good.replace("local function run(view)\n", "local function run(view)\n    error('aigc-itest deliberate failure')\n", 1)
    assert broken != good
    install_hook(broken, cluster.etc_dir)
    try:
        jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", "--comment=aigc:type=infer,vram=20G"))
        info = job(cluster, jobs[0])
        assert re.search(r"gpu:1$", info.tres_per_node) and info.comment.strip() == "aigc:type=infer,vram=20G"
        log = Path(cluster.state_dir, "log", "slurmctld.log")
        wait_for(lambda: "aigc-itest deliberate failure" in log.read_text(errors="replace"), 10, "the hook error in slurmctld.log")
    finally:
        install_hook(good, cluster.etc_dir)


def test_a_syntax_error_written_behind_installs_back_keeps_the_previous_hook(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    good = (cluster.etc_dir / HOOK_FILE).read_text()
    # A first job makes slurmctld load the good hook, so it is the "previous" one below.
    jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", "--comment=aigc:type=infer,vram=20G"))
    assert re.search(r"\bshard:40\b", job(cluster, jobs[0]).tres_per_node)
    atomic_write(cluster.etc_dir / HOOK_FILE, "function (\n")  # what `policy install` would refuse
    try:
        jobs.append(submit(cluster, SLEEP, "--gres=gpu:1", "--comment=aigc:type=infer,vram=20G"))
        assert re.search(r"\bshard:40\b", job(cluster, jobs[1]).tres_per_node)  # previous hook still active
    finally:
        atomic_write(cluster.etc_dir / HOOK_FILE, good)  # install_hook refuses to replace a file not ours


def test_a_comment_at_slurms_limit_is_still_accepted(cluster: Any, hook_installed: Path, jobs: list[str]) -> None:
    """slurmctld refuses a comment over 1,024 bytes after the plugin ran; the hook must not push one over."""
    comment = "aigc:type=infer,vram=20G " + "x" * (1024 - 25)
    assert len(comment) == 1024
    jobs.append(submit(cluster, SLEEP, "--hold", "--gres=gpu:1", f"--comment={comment}"))
    info = job(cluster, jobs[0])
    assert info.comment.strip() == comment and info.admin_comment == "aigc_class=infer"
    assert re.search(r"\bshard:40\b", info.tres_per_node)
