"""The `reclaim:` section of the policy file, as the reclaim package uses it.

The types and their defaults live in `slurm_aigc.policy.model`, the reader in
`slurm_aigc.policy.sections`; `slurm_aigc.policy.loader` reads the file once for every
section. This module keeps the names reclaim code imports.
"""

from __future__ import annotations

from pathlib import Path

from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.model import (
    ACTIONS,
    UNCLASSIFIED,
    VERDICTS,
    ClassPolicy,
    Exemptions,
    NotifyConfig,
    ReclaimConfig,
)
from slurm_aigc.policy.sections import reclaim_section as parse_reclaim_section


def load_reclaim_config(path: str | Path | None) -> ReclaimConfig:
    """`reclaim:` of the policy file at `path` (with the inventory's shards per GPU).

    The caller finds the file (`policy.paths.find_policy(..., required=False)`); None: no
    file anywhere, the model's defaults. A given path must exist.
    """
    return load_policy(path, hook_sections=False).reclaim


__all__ = [
    "ACTIONS", "UNCLASSIFIED", "VERDICTS", "ClassPolicy", "Exemptions", "NotifyConfig", "ReclaimConfig",
    "load_reclaim_config", "parse_reclaim_section",
]
