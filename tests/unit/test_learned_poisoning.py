"""The learned SM cannot be talked down by light jobs (review of issue 14.4, defect 1).

The hook uses a key's learned SM instead of its class's `expected_sm` to decide how many jobs
share a GPU. A plain mean over the key's jobs let a user run light jobs under a name and then
compute-heavy ones under the same name, packed as tightly as the light ones.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from slurm_aigc.policy.model import LearnedConfig
from slurm_aigc.telemetry.learned import JobUsage, learn
from tests.unit.test_learned import ALICE, CLASSES, NOW, history, runtime, submit

CONFIG = LearnedConfig(enabled=True)


def sm_of(sm_pcts: list[float]) -> float | None:
    jobs = history(len(sm_pcts))
    usage = {j.job_id: JobUsage(6000.0, sm) for j, sm in zip(jobs, sm_pcts, strict=True)}
    [entry] = learn(jobs, usage, CONFIG, NOW, CLASSES)
    return entry.sm


def test_one_heavy_job_makes_the_key_heavy_for_every_later_job() -> None:
    # Five light runs, then a compute-heavy one under the same name: a mean said 0.23.
    assert sm_of([10.0] * 5 + [90.0]) == 0.9
    # Many light runs do not dilute it either.
    assert sm_of([10.0] * 40 + [90.0]) == 0.9


def test_a_key_that_is_always_light_still_learns_its_light_figure() -> None:
    assert sm_of([10.0, 12.0, 9.0, 11.0, 10.0]) == 0.12


def test_the_learned_sm_is_rounded_up_as_it_caps_co_tenants() -> None:
    assert sm_of([40.1] * 5) == 0.41
    assert sm_of([40.0] * 5) == 0.4


def test_light_runs_do_not_get_a_later_heavy_job_shared(tmp_path: Path) -> None:
    """End to end: the table learned from 5 light runs and one heavy run, read by the hook."""
    jobs = history(6)
    usage = {j.job_id: JobUsage(6000.0, 10.0) for j in jobs[:5]} | {jobs[5].job_id: JobUsage(6000.0, 90.0)}
    [entry] = learn(jobs, usage, CONFIG, NOW, CLASSES)
    heavy = submit(runtime(tmp_path, [entry]), uid=ALICE)
    # SM 0.9 > rewrites.shard.max_sm: the next job of the key is not shared at all.
    assert heavy.job_class == "imagegen" and not str(heavy.changes.get("tres_per_node", ("", ""))[1]).startswith("gres:shard")
    (tmp_path / "light").mkdir()
    light = submit(runtime(tmp_path / "light", [replace(entry, sm=0.1)]), uid=ALICE)
    assert str(light.changes["tres_per_node"][1]).startswith("gres:shard")  # a light key still shares
