"""Cluster shape parsing and config rendering (pure; no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_aigc.errors import ClusterError
from slurm_aigc.localcluster.config import Layout, render_cgroup_conf, render_gres_conf, render_slurm_conf
from slurm_aigc.localcluster.manager import must_stop_first
from slurm_aigc.localcluster.shape import DEFAULT_SHAPE, parse_shape, shape_to_text


def layout(version: tuple[int, int, int] = (22, 5, 8)) -> Layout:
    return Layout(Path("/state"), "host", version)


def test_default_shape_is_two_a100_and_two_t4_nodes() -> None:
    shape = parse_shape(DEFAULT_SHAPE)
    assert [(n.name, n.gpu.gres_type, n.gpu_count) for n in shape.nodes] == [
        ("a100-01", "a100", 8), ("a100-02", "a100", 8), ("t4-01", "t4", 4), ("t4-02", "t4", 4)]
    assert len({n.port for n in shape.nodes}) == 4
    assert shape.total_gpus == 24
    assert shape_to_text(shape) == DEFAULT_SHAPE


@pytest.mark.parametrize("text", ["a100:8", "x100:8x1", "a100:0x1", "a100:8x0", "a100:17x1", "t4:4x65"])
def test_bad_shapes_name_the_problem(text: str) -> None:
    with pytest.raises(ClusterError, match="shape"):
        parse_shape(text)


def test_sixteen_node_mixed_shape() -> None:
    shape = parse_shape("a100:8x8,t4:4x6,l40s:2x2")
    assert len(shape.nodes) == 16
    assert shape.nodes[-1].name == "l40s-02"


def test_slurm_conf_declares_gres_shards_accounting_and_lua() -> None:
    text = render_slurm_conf(parse_shape(DEFAULT_SHAPE), layout())
    assert "GresTypes=gpu,shard" in text
    assert "JobSubmitPlugins=lua" in text
    assert "SelectType=select/cons_tres" in text
    assert "AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:t4,gres/shard" in text
    assert "AccountingStoreFlags=job_comment" in text
    assert "NodeName=a100-01 NodeHostname=host NodeAddr=127.0.0.1 Port=17001" in text
    assert "Gres=gpu:a100:8,shard:640" in text
    assert "Gres=gpu:t4:4,shard:64" in text


def test_gres_conf_gives_every_gpu_and_shard_a_device_file() -> None:
    text = render_gres_conf(parse_shape("t4:2x1"), layout())
    assert "AutoDetect=off" in text
    assert "NodeName=t4-01 Name=gpu Type=t4 File=/state/dev/t4-01/nvidia1" in text
    assert "NodeName=t4-01 Name=shard Count=16 File=/state/dev/t4-01/nvidia0" in text


def test_cgroup_conf_depends_on_version() -> None:
    assert "CgroupPlugin=disabled" in render_cgroup_conf(layout((24, 11, 5)))
    assert "CgroupPlugin" not in render_cgroup_conf(layout((22, 5, 8)))


@pytest.mark.parametrize(("saved", "running", "replace", "stop"), [
    (None, False, False, False),            # first bring-up
    (DEFAULT_SHAPE, True, False, False),    # same shape: idempotent up
    ("a100:8x6,t4:4x10", False, False, True),  # a stopped benchmark shape is forgotten
    ("a100:8x6,t4:4x10", True, True, True),    # a running one is replaced when asked
])
def test_up_stops_another_shape_first_only_when_allowed(saved: str | None, running: bool, replace: bool, stop: bool) -> None:
    assert must_stop_first(saved, running, DEFAULT_SHAPE, replace=replace) is stop


def test_up_refuses_to_replace_a_running_cluster_unasked() -> None:
    with pytest.raises(ClusterError, match=r"a100:8x6,t4:4x10 is up.*--replace"):
        must_stop_first("a100:8x6,t4:4x10", True, DEFAULT_SHAPE, replace=False)
