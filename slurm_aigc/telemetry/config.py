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
from slurm_aigc.policy.paths import SYSTEM_POLICY
from slurm_aigc.policy.sections import agent_section as parse_agent_section
from slurm_aigc.policy.sections import scoring_section as parse_scoring_section

DEFAULT_CONFIG_PATH = str(SYSTEM_POLICY)


def load_agent_config(explicit: str | None) -> AgentConfig:
    """`agent:` of the policy file (`--config`, else as `load_policy` finds it)."""
    return load_policy(explicit, hook_sections=False).agent


def load_scoring_config(explicit: str | None) -> ScoringConfig:
    """`scoring:` of the policy file (`--config`, else as `load_policy` finds it)."""
    return load_policy(explicit, hook_sections=False).scoring


__all__ = [
    "BACKENDS", "DEFAULT_CONFIG_PATH", "DEFAULT_PUBLISHED_FEATURES_FILE", "DEFAULT_SIMGPU_DIR", "AgentConfig",
    "ScoringConfig", "load_agent_config", "load_scoring_config", "parse_agent_section", "parse_scoring_section",
]
