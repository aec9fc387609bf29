"""The integration tests' reading of a job's GPU indices on Slurm 22.05 and 24.11."""

from __future__ import annotations

import pytest

from slurm_aigc.slurm import JobInfo
from tests.integration.helpers import gpu_indices_of_job


def job(gres_detail: tuple[tuple[str, str], ...]) -> JobInfo:
    return JobInfo("7", "telemetry-sim", "root", "aigc", "gpu", "normal", "RUNNING", "None", "a100-01", True, False,
                   0, None, None, None, 60, "", "", "gres/gpu:a100:2", "", 1, "", {}, gres_detail)


@pytest.mark.parametrize(("gres", "indices"), [
    ("gpu:a100:2(IDX:3-4)", [3, 4]),
    ("shard:8(IDX:1)", [1]),                                   # 22.05
    ("shard:8(8/16,0/16,0/16,0/16)", [0]),                     # 24.05+: used/total per GPU
    ("shard:a100:12(0/16,8/16,0/16,4/16)", [1, 3]),
])
def test_gpu_indices_in_both_detail_forms(gres: str, indices: list[int]) -> None:
    assert gpu_indices_of_job(job((("a100-01", gres),))) == indices


@pytest.mark.parametrize("detail", [(), (("a100-01", "gpu:a100:1(IDX:0)"), ("a100-02", "gpu:a100:1(IDX:0)")),
                                    (("a100-01", "shard:8(0/16,0/16)"),)])
def test_not_a_one_node_gpu_job_fails_naming_it(detail: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(AssertionError, match="one-node GPU job|no GPU indices"):
        gpu_indices_of_job(job(detail))
