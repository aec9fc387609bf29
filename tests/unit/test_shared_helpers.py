"""The shared helpers every layer uses: one table layout, one percentile, one profile grammar, one atomic write."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_aigc.fsio import atomic_write_text
from slurm_aigc.profiles import PHASE_KINDS, Phase, ProfileError, format_phases, parse_phases, total_seconds
from slurm_aigc.series import GpuSeries, Sample
from slurm_aigc.stats import mean, percentile
from slurm_aigc.textfmt import short_number, text_table


def test_text_table_aligns_names_left_and_numbers_right() -> None:
    table = text_table(("class", "jobs", "ratio"), [("train", "12", "0.5x"), ("infer", "3", "-")])
    assert table.splitlines() == [
        "class  jobs  ratio",
        "-----  ----  -----",
        "train    12   0.5x",
        "infer     3      -",
    ]
    assert text_table(("a", "b"), [("x", "")], rule=False) == "a  b\nx"  # trailing spaces cut


def test_text_table_refuses_a_ragged_row() -> None:
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        text_table(("a", "b", "c"), [("1", "2")])


def test_short_number() -> None:
    assert [short_number(v) for v in (30.0, 12.5, 0.1234, 2.0004)] == ["30", "12.5", "0.123", "2"]


def test_percentile_is_nearest_rank_and_mean_of_nothing_is_none() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 95) == 19.0 and percentile(values, 100) == 20.0 and percentile(values, 0) == 1.0
    assert percentile([], 95) is None and mean([]) is None and mean([1.0, 2.0]) == 1.5


def test_profile_grammar_parses_repeat_and_refuses_bad_parts() -> None:
    assert parse_phases("loading:30, busy:120 ,idle:60") == ((Phase("loading", 30.0), Phase("busy", 120.0), Phase("idle", 60.0)), False)
    assert parse_phases("busy:10,idle:5,repeat") == ((Phase("busy", 10.0), Phase("idle", 5.0)), True)
    for spec, problem in [("busy:30,,idle:5", "unknown phase ''"), ("busy:inf", "finite"), ("busy:nan", "finite"),
                          ("nap:5", "unknown phase 'nap'"), ("busy", "needs seconds"), ("repeat", "no phases")]:
        with pytest.raises(ProfileError, match=problem):
            parse_phases(spec)
    with pytest.raises(ProfileError, match="no end"):
        format_phases((Phase("busy", math.inf),))


@given(st.lists(st.tuples(st.sampled_from(PHASE_KINDS), st.integers(1, 10_000).map(lambda n: n / 8)), min_size=1, max_size=6),
       st.booleans())
def test_profile_format_parses_back(items: list[tuple[str, float]], repeat: bool) -> None:
    phases = tuple(Phase(kind, seconds) for kind, seconds in items)
    assert parse_phases(format_phases(phases, repeat)) == (phases, repeat)
    assert total_seconds(phases) == sum(seconds for _, seconds in items)


def test_gpu_series_peak_memory_skips_unread_samples() -> None:
    series = GpuSeries("n1", 0, (Sample(1.0, 50.0, None), Sample(2.0, 60.0, 2048.0), Sample(3.0, None, 1024.0)))
    assert series.peak_memory_mib == 2048.0
    assert GpuSeries("n1", 0, (Sample(1.0, 5.0, None),)).peak_memory_mib is None


def test_atomic_write_replaces_with_mode_and_mtime_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "models.txt"
    target.write_text("old\n")
    atomic_write_text(target, "new\n", mode=0o640, mtime=1_000_000.0, durable=True)
    assert target.read_text() == "new\n"
    assert (os.stat(target).st_mode & 0o777, os.stat(target).st_mtime) == (0o640, 1_000_000.0)
    assert [p.name for p in tmp_path.iterdir()] == ["models.txt"]


def test_atomic_write_failure_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "folder-in-the-way"
    target.mkdir()
    with pytest.raises(OSError):
        atomic_write_text(target, "text")  # os.replace cannot put a file over a directory
    assert target.is_dir() and [p.name for p in tmp_path.iterdir()] == ["folder-in-the-way"]
