"""Trace-to-workload options shared by `replay convert`, `replay compare` and `demo`.

Its own module so that `cli/replay.py` (the `replay` group) and `cli/replay_run.py` (the
commands that run on the local cluster) both import it and not each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from slurm_aigc.replay import generator, traces
from slurm_aigc.replay.workload import MAX_SECONDS, Workload

TRACE_CHOICES = (*traces.TRACES, "mix")


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that refuses nan (which passes every comparison) and inf as well."""

    name = "float range"  # the metavar, as click.FloatRange has it

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def positive_float(maximum: float | None = None) -> FiniteFloatRange:
    """A finite number > 0 (and <= `maximum`): compressions, durations, loads."""
    return FiniteFloatRange(min=0, max=maximum, min_open=True)


COMPRESSION_TYPE = positive_float(generator.MAX_COMPRESSION)


def default_trace_input() -> Path:
    """The shared traces folder beside the checkout, else the project's small fixtures."""
    repo = Path(__file__).resolve().parents[2]
    shared = repo.parent / "shared" / "traces"
    return shared if shared.is_dir() else repo / "tests" / "fixtures" / "traces"


FIXTURE_FILES = {
    "alibaba-2023": "openb_pod_list_small.csv",
    "genai-2026": "lora_request_trace_small.csv",
    "philly": "pollux_philly_jobs_small.csv",
}


def _trace_file(name: str, input_path: Path) -> Path:
    fixture = input_path / FIXTURE_FILES[name]
    return fixture if input_path.is_dir() and fixture.is_file() else input_path


def generator_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The options that turn a trace into a workload (shared by `convert` and `compare`)."""
    options = [
        click.option("--trace", "trace", type=click.Choice(TRACE_CHOICES), default=None,
                     help="Which trace (mix: all three, by mix_weights)."),
        click.option("--input", "input_path", type=click.Path(path_type=Path, exists=True), default=None,
                     help="Trace file, or a folder holding it (for mix: the traces folder with the three subfolders); "
                          "default ../shared/traces, else the project's small fixtures."),
        click.option("--seed", type=int, default=None, help="Random seed (default 1)."),
        click.option("--compression", type=COMPRESSION_TYPE, default=None,
                     help="Trace seconds per replay second, for arrivals and durations (default 60)."),
        click.option("--duration-s", type=positive_float(MAX_SECONDS), default=None, help="Replay seconds over which jobs arrive (default 150)."),
        click.option("--minutes", type=positive_float(MAX_SECONDS // 60), default=None, help="Same as --duration-s, in minutes."),
        click.option("--max-jobs", type=click.IntRange(1, generator.MAX_COUNT), default=None, help="At most this many jobs (default 150)."),
        click.option("--capacity-gpus", type=click.IntRange(1, generator.MAX_COUNT), default=None,
                     help="GPUs of the cluster the load is sized for (default 24)."),
        click.option("--load", "load_target", type=positive_float(generator.MAX_LOAD_TARGET), default=None,
                     help="Whole-GPU demand / capacity over the window (default 2.0)."),
        click.option("--window-start-s", type=FiniteFloatRange(min=0), default=None,
                     help="Trace seconds after its first arrival where the window starts."),
        click.option("--untagged-fraction", type=FiniteFloatRange(0, 1), default=None,
                     help="Share of jobs submitted without an aigc: tag, drawn per job from the seed (default 0)."),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Any generator parameter (e.g. infer.loading_s=5)."),
        click.option("--show-skipped", type=click.IntRange(min=0), default=5, show_default=True, help="Print this many skipped trace rows."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@dataclass(frozen=True)
class GeneratorChoice:
    """What the generator options asked for."""

    trace: str | None
    input_path: Path | None
    seed: int | None = None
    compression: float | None = None
    duration_s: float | None = None
    minutes: float | None = None
    max_jobs: int | None = None
    capacity_gpus: int | None = None
    load_target: float | None = None
    window_start_s: float | None = None
    overrides: tuple[str, ...] = ()
    show_skipped: int = 5
    untagged_fraction: float | None = None


def workload_from_traces(choice: GeneratorChoice) -> tuple[Workload, generator.GeneratorParams]:
    """Read the chosen trace(s) (reporting skipped rows) and generate the seeded workload."""
    if choice.trace is None:
        raise click.UsageError("give --trace (alibaba-2023, genai-2026, philly or mix)")
    if choice.duration_s is not None and choice.minutes is not None:
        raise click.UsageError("give --duration-s or --minutes, not both")
    params = generator.with_overrides(generator.GeneratorParams(), _pairs(choice.overrides))
    named: dict[str, Any] = {
        "seed": choice.seed,
        "compression": choice.compression,
        "arrival_window_s": choice.duration_s if choice.minutes is None else choice.minutes * 60,
        "max_jobs": choice.max_jobs,
        "capacity_gpus": choice.capacity_gpus,
        "load_target": choice.load_target,
        "window_start_s": choice.window_start_s,
        "untagged_fraction": choice.untagged_fraction,
    }
    params = replace(params, **{k: v for k, v in named.items() if v is not None})
    generator.check_params(params)  # before reading traces: a bad value is reported at once
    input_path = choice.input_path or default_trace_input()
    names = traces.TRACES if choice.trace == "mix" else (choice.trace,)
    sources = {}
    for name in names:
        read = traces.read_trace(name, _trace_file(name, input_path))
        _report_skipped(name, read, choice.show_skipped)
        sources[name] = read.jobs
    return generator.generate(sources, params), params


def _pairs(items: Sequence[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--set")
        pairs[key.strip()] = value.strip()
    return pairs


def _report_skipped(name: str, read: traces.TraceRead, limit: int) -> None:
    if not read.skipped:
        return
    click.echo(f"{name}: skipped {len(read.skipped)} malformed row(s) of {len(read.skipped) + len(read.jobs)}", err=True)
    for row in read.skipped[:limit]:
        click.echo(f"  line {row.line}: {row.reason}", err=True)
