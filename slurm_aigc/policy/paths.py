"""Where the policy and the installed hook live.

The shipped default policy is `etc/slurm-aigc.yaml` of the source tree, found relative to
this package (an editable install, the project's supported layout), or `slurm_aigc/data/`
when a wheel ships it there; no copy is kept in the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_POLICY = Path("/etc/slurm-aigc/slurm-aigc.yaml")
ENV_POLICY = "SLURM_AIGC_CONFIG"


def shipped_policy() -> Path:
    """etc/slurm-aigc.yaml next to the package (source checkout) or in slurm_aigc/data/."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package.parent / "etc" / "slurm-aigc.yaml", package / "data" / "slurm-aigc.yaml"):
        if candidate.is_file():
            return candidate
    return package.parent / "etc" / "slurm-aigc.yaml"


def default_policy() -> Path:
    """`$SLURM_AIGC_CONFIG`, else /etc/slurm-aigc/slurm-aigc.yaml if present, else the shipped one."""
    env = os.environ.get(ENV_POLICY)
    if env:
        return Path(env)
    if SYSTEM_POLICY.is_file():
        return SYSTEM_POLICY
    return shipped_policy()


def slurm_conf_dir() -> Path:
    """Slurm's config dir, from the Slurm boundary (`$SLURM_CONF`'s directory)."""
    from slurm_aigc.slurm import slurm_conf_dir as boundary_conf_dir

    return boundary_conf_dir()
