"""AllocTRES parsing: GPUs and shards per type, memory units, unknown TRES kept raw."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_aigc.report.tres import (
    MIXED,
    NO_GPU,
    UNTYPED,
    TresParseError,
    gpu_equivalents,
    gpu_type_of,
    parse_tres,
)

SHARDS = {"a100": 80, "t4": 16}


def test_typical_alloc_tres() -> None:
    tres = parse_tres("billing=4,cpu=4,gres/gpu:a100=2,gres/gpu=2,gres/shard=20,mem=8G,node=1")
    assert (tres.gpus, dict(tres.gpus_by_type)) == (2, {"a100": 2})
    assert (tres.shards, dict(tres.shards_by_type)) == (20, {})
    assert (tres.cpus, tres.memory_mib, tres.nodes) == (4, 8192.0, 1)
    assert dict(tres.other) == {"billing": "4"}
    assert tres.gpu_type == "a100"


def test_unknown_tres_are_kept_not_fatal() -> None:
    tres = parse_tres("cpu=2,gres/gpu:a100=1,gres/gpu=1,gres/nic=1,license/matlab=1,gres/mps=50,fs/disk=10,mem=4096M")
    assert tres.gpus == 1
    assert dict(tres.other) == {"gres/nic": "1", "license/matlab": "1", "gres/mps": "50", "fs/disk": "10"}
    assert tres.memory_mib == 4096.0


def test_typed_counts_add_up_without_untyped_total() -> None:
    tres = parse_tres("gres/gpu:a100=2,gres/gpu:t4=1")
    assert tres.gpus == 3
    assert tres.gpu_type == MIXED


def test_empty_and_untyped() -> None:
    assert parse_tres("").gpu_type == NO_GPU
    assert parse_tres("cpu=1,mem=1000M,node=1").gpus == 0
    assert parse_tres("gres/gpu=2").gpu_type == UNTYPED


@pytest.mark.parametrize("text, fragment", [("cpu", "'cpu'"), ("cpu=one", "cpu='one'"), ("mem=lots", "mem='lots'"),
                                            ("gres/gpu=1.5", "gres/gpu='1.5'"), ("=3", "'=3'")])
def test_malformed_fragments_name_themselves(text: str, fragment: str) -> None:
    with pytest.raises(TresParseError, match=fragment):
        parse_tres(text)


def test_shards_become_gpu_fractions() -> None:
    assert gpu_equivalents(parse_tres("gres/shard:t4=8,gres/shard=8"), SHARDS) == (0.0, 0.5, True)
    # Untyped shards take the type of the node they ran on.
    assert gpu_equivalents(parse_tres("gres/shard=20"), SHARDS, "a100-02") == (0.0, 0.25, True)
    assert gpu_equivalents(parse_tres("gres/shard=20"), SHARDS, "node7") == (0.0, 0.0, False)
    assert gpu_equivalents(parse_tres("gres/shard:h100=20"), SHARDS) == (0.0, 0.0, False)
    assert gpu_equivalents(parse_tres("gres/gpu:a100=2,gres/gpu=2"), SHARDS) == (2.0, 0.0, True)


def test_gpu_type_from_node_names_when_untyped() -> None:
    assert gpu_type_of(parse_tres("gres/gpu=1"), SHARDS, "t4-01") == "t4"
    assert gpu_type_of(parse_tres("gres/gpu=1"), SHARDS, "gpu-01") == UNTYPED


def test_node_names_take_the_longest_type_they_start_with_on_every_node() -> None:
    """Audit 7: with a10 and a100, `a100-01` is an a100 (not both, so neither); a node list must agree."""
    shards = {"a10": 40, "a100": 80, "t4": 16}
    untyped = parse_tres("gres/shard=20")
    assert gpu_equivalents(untyped, shards, "a100-01") == (0.0, 0.25, True)
    assert gpu_equivalents(untyped, shards, "a100n3") == (0.0, 0.25, True)
    assert gpu_equivalents(untyped, shards, "a10-01") == (0.0, 0.5, True)
    assert gpu_equivalents(untyped, shards, "a100-[01-02]") == (0.0, 0.25, True)
    assert gpu_equivalents(untyped, shards, "a100-01,a10-01") == (0.0, 0.0, False)
    assert gpu_equivalents(untyped, shards, "a100-01,gpu-01") == (0.0, 0.0, False)
    assert gpu_type_of(parse_tres("gres/gpu=2"), shards, "A100-[01-02]") == "a100"
    assert gpu_type_of(parse_tres("gres/gpu=1"), shards, "t401") == UNTYPED  # t4 does not end a word there


@given(st.dictionaries(st.sampled_from(["a100", "t4", "h100", "l40s"]), st.integers(0, 64), max_size=4),
       st.integers(0, 512), st.integers(1, 1 << 20))
def test_round_trip(gpus: dict[str, int], cpus: int, mem_mib: int) -> None:
    parts = [f"cpu={cpus}"] + [f"gres/gpu:{t}={n}" for t, n in gpus.items()]
    parts += [f"gres/gpu={sum(gpus.values())}"] if gpus else []
    parts.append(f"mem={mem_mib}M")
    tres = parse_tres(",".join(sorted(parts)))
    assert tres.gpus == sum(gpus.values())
    assert dict(tres.gpus_by_type) == gpus
    assert (tres.cpus, tres.memory_mib) == (cpus, float(mem_mib))
