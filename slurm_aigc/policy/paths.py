"""Where the policy file is: `$SLURM_AIGC_CONFIG`, /etc/slurm-aigc/slurm-aigc.yaml, or the shipped one.

A boundary (it reads the environment and looks at the file system): the pure loader takes
what is found here as arguments (`slurm_aigc.policy.site` hands them over). The shipped
default policy is `etc/slurm-aigc.yaml` of the source tree, or
`slurm_aigc/data/etc/slurm-aigc.yaml` of an installed wheel; `slurm_aigc.shipped` finds it.
"""

from __future__ import annotations

import os
from pathlib import Path

from slurm_aigc.errors import ShippedFileError
from slurm_aigc.shipped import POLICY, shipped_file

SYSTEM_POLICY = Path("/etc/slurm-aigc/slurm-aigc.yaml")
ENV_POLICY = "SLURM_AIGC_CONFIG"
ENV_SIMGPU_DIR = "SLURM_AIGC_SIMGPU_DIR"  # the agent's simulated GPUs when agent.simgpu_dir is absent


def shipped_policy() -> Path:
    """etc/slurm-aigc.yaml of the source checkout, else of the wheel's slurm_aigc/data/."""
    return shipped_file(POLICY)


def default_policy() -> Path:
    """`$SLURM_AIGC_CONFIG`, else /etc/slurm-aigc/slurm-aigc.yaml if present, else the shipped one."""
    env = os.environ.get(ENV_POLICY)
    if env:
        return Path(env)
    if SYSTEM_POLICY.is_file():
        return SYSTEM_POLICY
    return shipped_policy()


def find_policy(explicit: str | Path | None = None, *, required: bool = True) -> Path | None:
    """`explicit` (`--config`/`--policy`) as given, else `default_policy()`.

    Not `required` (the daemons, which run on the model's defaults): None when there is no
    file anywhere (a wheel installed without its data) instead of ShippedFileError.
    """
    if explicit is not None:
        return Path(explicit)
    try:
        return default_policy()
    except ShippedFileError:
        if required:
            raise
        return None


def simgpu_dir_from_env() -> str | None:
    """`$SLURM_AIGC_SIMGPU_DIR`: the agent's simulated GPUs when the policy's `agent.simgpu_dir` is absent."""
    return os.environ.get(ENV_SIMGPU_DIR) or None
