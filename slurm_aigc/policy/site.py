"""The site's policy: the file the environment names, read by the one loader.

Above both halves it joins: `policy.paths` (a boundary: `--config`/`--policy`,
`$SLURM_AIGC_CONFIG`, /etc/slurm-aigc/slurm-aigc.yaml, the shipped file, and
`$SLURM_AIGC_SIMGPU_DIR`) and `policy.loader` (pure but for reading the file it is handed).
The CLI and the daemons call this; tests and tools that hold a path call the loader.
"""

from __future__ import annotations

from pathlib import Path

from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.model import Policy
from slurm_aigc.policy.paths import find_policy, simgpu_dir_from_env


def load_site_policy(explicit: str | Path | None = None, *, hook_sections: bool = True) -> Policy:
    """`load_policy` of `explicit`, else of `$SLURM_AIGC_CONFIG`, /etc/slurm-aigc/slurm-aigc.yaml, the shipped file.

    `hook_sections` False (the daemons): a file may leave out `inventory` and `classes`, and
    with no file anywhere the model's defaults apply; True: ShippedFileError names every place
    looked. An absent `agent.simgpu_dir` is `$SLURM_AIGC_SIMGPU_DIR` when set.
    """
    path = find_policy(explicit, required=hook_sections)
    return load_policy(path, hook_sections=hook_sections, simgpu_dir=simgpu_dir_from_env())
