"""The `agent` and `scoring` sections of the policy file, as the telemetry package uses them.

The types and their defaults live in `slurm_aigc.policy.model`, the readers in
`slurm_aigc.policy.sections`; `slurm_aigc.policy.loader` reads the file once for every
section. This module keeps the names telemetry code imports.
"""

from __future__ import annotations

from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.model import (
    AGENT_BACKENDS as BACKENDS,
)
from slurm_aigc.policy.model import (
    DEFAULT_PUBLISHED_FEATURES_FILE,
    DEFAULT_SIMGPU_DIR,
    AgentConfig,
    ScoringConfig,
)
from slurm_aigc.policy.sections import agent_section as parse_agent_section
from slurm_aigc.policy.sections import scoring_section as parse_scoring_section


def load_scoring_config(path: str | None) -> ScoringConfig:
    """`scoring:` of the policy file at `path`; the caller finds it (`policy.paths.find_policy`), None: defaults."""
    return load_policy(path, hook_sections=False).scoring


__all__ = [
    "BACKENDS", "DEFAULT_PUBLISHED_FEATURES_FILE", "DEFAULT_SIMGPU_DIR", "AgentConfig",
    "ScoringConfig", "load_scoring_config", "parse_agent_section", "parse_scoring_section",
]
