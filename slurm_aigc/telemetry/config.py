"""The `agent` and `scoring` sections of the policy YAML (`etc/slurm-aigc.yaml`).

Both are read through `slurm_aigc.validation`, so an unknown key or a wrong type is an error
naming the file and the key path. An absent section means "all defaults".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slurm_aigc.errors import ConfigError
from slurm_aigc.telemetry import scoring
from slurm_aigc.validation import Node, get, mapping, optional, string_list

DEFAULT_CONFIG_PATH = "/etc/slurm-aigc/slurm-aigc.yaml"
DEFAULT_SIMGPU_DIR = "/var/lib/slurm-aigc/simgpu"
DEFAULT_PUBLISHED_FEATURES_FILE = "/var/lib/slurm-aigc/published-features.txt"
BACKENDS = ("nvml", "sim")

DEFAULT_AGENT_YAML = """\
agent:
  backend: nvml              # nvml (real GPUs) | sim (simulated GPUs of the local cluster)
  simgpu_dir: /var/lib/slurm-aigc/simgpu   # only for backend sim
  interval_s: 10             # one poll of every GPU per interval
  publish_features: true     # publish static node features (a100, vram80g, nvlink8)
  feature_check_s: 60        # how often to check Slurm still has them (reconfigure forgets)
  metrics_port: null         # Prometheus metrics on this port when set
"""

DEFAULT_SCORING_YAML = """\
scoring:
  interval_s: 30             # one publisher cycle per interval
  window_s: 300              # mean utilization over the samples of the last window
  weight_min: 1              # Slurm Weight of the most preferred node
  weight_max: 100            # Slurm Weight of the least preferred node
  hysteresis: 5              # rewrite a weight only when it moves by at least this much
  publish_nvfree: true       # nvfree<N>: largest free NVLink-connected GPU set
  publish_models: true       # model_<id>: models served on the node
  serving_classes: [infer, serve]   # job classes whose model=... counts as serving
  # model_<id> features on some node, one per line, for the job_submit hook's --prefer
  # (must be the hook's rewrites.model_prefer.published_features_file); null: do not write
  published_features_file: /var/lib/slurm-aigc/published-features.txt
  model_linger_s: 300        # a model stays a node feature this long after its last job (warm cache)
  model_unlist_grace_s: 30   # unlisted this long before removal: > the hook's refresh_seconds
  policies:                  # plugin name: weight (scores are weighted and averaged)
    cool_first: 1
    pack_keep_islands: 1
"""


@dataclass(frozen=True)
class AgentConfig:
    """The `agent:` section."""

    backend: str = "nvml"
    simgpu_dir: str = DEFAULT_SIMGPU_DIR
    interval_s: float = 10.0
    publish_features: bool = True
    feature_check_s: float = 60.0
    metrics_port: int | None = None


@dataclass(frozen=True)
class ScoringConfig:
    """The `scoring:` section."""

    interval_s: float = 30.0
    window_s: float = 300.0
    weight_min: int = 1
    weight_max: int = 100
    hysteresis: int = 5
    publish_nvfree: bool = True
    publish_models: bool = True
    serving_classes: tuple[str, ...] = ("infer", "serve")
    published_features_file: str | None = None  # the YAML's default is DEFAULT_PUBLISHED_FEATURES_FILE
    model_linger_s: float = 300.0
    model_unlist_grace_s: float = 30.0
    policies: Mapping[str, float] | None = None

    def policy_weights(self) -> Mapping[str, float]:
        """The enabled plugins and their weights (defaults when the YAML names none)."""
        return self.policies if self.policies is not None else {"cool_first": 1.0, "pack_keep_islands": 1.0}


def parse_agent_section(node: Node) -> AgentConfig:
    """Read `agent:`; `node.value` None (section absent) gives the defaults."""
    mapping(node, {"backend", "simgpu_dir", "interval_s", "publish_features", "feature_check_s", "metrics_port"})
    node = _as_mapping(node)
    default = AgentConfig(simgpu_dir=os.environ.get("SLURM_AIGC_SIMGPU_DIR", DEFAULT_SIMGPU_DIR))
    backend = get(node, "backend", str, default.backend)
    if backend not in BACKENDS:
        raise node.child("backend").error(f"expected one of {', '.join(BACKENDS)}, got {backend!r}")
    port = optional(node, "metrics_port", int)
    if port is not None and not 0 < port < 65536:
        raise node.child("metrics_port").error(f"expected a TCP port 1-65535, got {port}")
    return AgentConfig(
        backend=backend,
        simgpu_dir=get(node, "simgpu_dir", str, default.simgpu_dir),
        interval_s=_positive(node, "interval_s", default.interval_s),
        publish_features=get(node, "publish_features", bool, default.publish_features),
        feature_check_s=_positive(node, "feature_check_s", default.feature_check_s),
        metrics_port=port,
    )


def parse_scoring_section(node: Node) -> ScoringConfig:
    """Read `scoring:`; plugin names must be registered in `scoring.SCORERS`."""
    allowed = {"interval_s", "window_s", "weight_min", "weight_max", "hysteresis", "publish_nvfree",
               "publish_models", "serving_classes", "policies", "published_features_file",
               "model_linger_s", "model_unlist_grace_s"}
    mapping(node, allowed)
    node = _as_mapping(node)
    default = ScoringConfig()
    weight_min = get(node, "weight_min", int, default.weight_min)
    weight_max = get(node, "weight_max", int, default.weight_max)
    if not 0 <= weight_min < weight_max:
        raise node.error(f"need 0 <= weight_min < weight_max, got {weight_min} and {weight_max}")
    hysteresis = get(node, "hysteresis", int, default.hysteresis)
    if hysteresis < 0:
        raise node.child("hysteresis").error(f"expected a non-negative integer, got {hysteresis}")
    serving = string_list(node, "serving_classes") if "serving_classes" in node.value else default.serving_classes
    return ScoringConfig(
        interval_s=_positive(node, "interval_s", default.interval_s),
        window_s=_positive(node, "window_s", default.window_s),
        weight_min=weight_min,
        weight_max=weight_max,
        hysteresis=hysteresis,
        publish_nvfree=get(node, "publish_nvfree", bool, default.publish_nvfree),
        publish_models=get(node, "publish_models", bool, default.publish_models),
        serving_classes=serving,
        published_features_file=_published_file(node, DEFAULT_PUBLISHED_FEATURES_FILE),
        policies=_policies(node) if node.value.get("policies") is not None else None,
        model_linger_s=_non_negative(node, "model_linger_s", default.model_linger_s),
        model_unlist_grace_s=_non_negative(node, "model_unlist_grace_s", default.model_unlist_grace_s),
    )


def _non_negative(node: Node, key: str, default: float) -> float:
    value = get(node, key, float, default)
    if value < 0:
        raise node.child(key).error(f"expected a number >= 0, got {value}")
    return value


def _policies(node: Node) -> Mapping[str, float]:
    child = node.child("policies")
    if not isinstance(child.value, Mapping) or not child.value:
        raise child.error("expected a mapping of plugin name to weight, e.g. {cool_first: 1}")
    result: dict[str, float] = {}
    for name in child.value:
        if name not in scoring.SCORERS:
            raise child.error(f"unknown scoring plugin {name!r}; known: {', '.join(sorted(scoring.SCORERS))}")
        weight = get(child, name, float)
        if weight < 0:
            raise child.child(name).error(f"expected a non-negative weight, got {weight}")
        result[str(name)] = weight
    return result


def _published_file(node: Node, default: str | None) -> str | None:
    if "published_features_file" not in node.value:
        return default
    path = optional(node, "published_features_file", str)
    if path is not None and not path.startswith("/"):
        raise node.child("published_features_file").error(f"expected an absolute path, got {path!r}")
    return path


def _positive(node: Node, key: str, default: float) -> float:
    value = get(node, key, float, default)
    if value <= 0:
        raise node.child(key).error(f"expected a positive number, got {value}")
    return value


def _as_mapping(node: Node) -> Node:
    return Node(node.source, node.path, {} if node.value is None else node.value)


def config_path(explicit: str | None) -> tuple[Path, bool]:
    """The config file to read and whether it must exist (given on the command line or env)."""
    if explicit:
        return Path(explicit), True
    env = os.environ.get("SLURM_AIGC_CONFIG")
    if env:
        return Path(env), True
    return Path(DEFAULT_CONFIG_PATH), False


def load_section(path: Path, section: str, required: bool) -> Node:
    """The `section` of the YAML file at `path` as a Node (value None when absent)."""
    source = str(path)
    if not path.exists():
        if required:
            raise ConfigError(source, "", "no such file")
        return Node(source, section, None)
    try:
        document: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(source, "", f"cannot read YAML: {error}") from error
    if document is None:
        return Node(source, section, None)
    if not isinstance(document, Mapping):
        raise ConfigError(source, "", f"expected a mapping of sections, got {type(document).__name__}")
    return Node(source, section, document.get(section))


def load_agent_config(explicit: str | None) -> AgentConfig:
    """`agent:` of the config file (`--config`, `$SLURM_AIGC_CONFIG` or the default path)."""
    path, required = config_path(explicit)
    return parse_agent_section(load_section(path, "agent", required))


def load_scoring_config(explicit: str | None) -> ScoringConfig:
    """`scoring:` of the config file (`--config`, `$SLURM_AIGC_CONFIG` or the default path)."""
    path, required = config_path(explicit)
    return parse_scoring_section(load_section(path, "scoring", required))
