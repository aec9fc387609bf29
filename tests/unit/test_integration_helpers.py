"""The integration tests' reading of `scontrol show job -d` on Slurm 22.05 and 24.11."""

from __future__ import annotations

import pytest

from tests.integration.helpers import gpu_indices_from_job_detail

DETAIL_22_05 = """JobId=7 JobName=telemetry-sim
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=1,node=1,billing=1,gres/gpu=2,gres/gpu:a100=2
     Nodes=a100-01 CPU_IDs=0 Mem=0 GRES={gres}
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
"""


@pytest.mark.parametrize(("gres", "indices"), [
    ("gpu:a100:2(IDX:3-4)", [3, 4]),
    ("shard:8(IDX:1)", [1]),                                   # 22.05
    ("shard:8(8/16,0/16,0/16,0/16)", [0]),                     # 24.11: used/total per GPU
    ("shard:a100:12(0/16,8/16,0/16,4/16)", [1, 3]),
])
def test_gpu_indices_in_both_detail_forms(gres: str, indices: list[int]) -> None:
    assert gpu_indices_from_job_detail(DETAIL_22_05.format(gres=gres)) == indices


def test_no_gpu_detail_fails_naming_the_text() -> None:
    with pytest.raises(AssertionError, match="no single-node GPU detail"):
        gpu_indices_from_job_detail(DETAIL_22_05.format(gres=""))
