"""The files slurm-aigc ships beside its Python code, and the one function that finds them.

Their single source is the top of the source tree (`etc/`, `job_submit_lua/`, `daemon/`).
`slurm_aigc/data/` holds relative symlinks to those three directories; setuptools copies the
targets' contents into the wheel (package_data in setup.cfg), so an installed wheel has
`slurm_aigc/data/etc/slurm-aigc.yaml` etc. with the same bytes and no copy is committed.
"""

from __future__ import annotations

from pathlib import Path

from slurm_aigc.errors import ShippedFileError

PACKAGE_DIR = Path(__file__).resolve().parent

# Every shipped file, as its path in the source tree (and under slurm_aigc/data/ in a wheel).
POLICY = "etc/slurm-aigc.yaml"
HOOK = "job_submit_lua/aigc_hook.lua"
HOOK_ENTRY = "job_submit_lua/job_submit.lua"
AGENT_UNIT = "daemon/slurm-aigc-agent.service"
CONTROLLER_UNIT = "daemon/slurm-aigc-controller.service"
JOB_RECORD = "daemon/slurm-aigc-jobrecord"  # Prolog= and Epilog= (docs/telemetry.md)
TASK_PROLOG = "daemon/slurm-aigc-taskprolog"  # TaskProlog=: a shard job's GPU memory share (docs/reclaim.md)
TORCH_LIMIT = "daemon/slurm-aigc-torchlimit"  # PyTorch wrapper applying that share (docs/reclaim.md)
SHIPPED = (POLICY, HOOK, HOOK_ENTRY, AGENT_UNIT, CONTROLLER_UNIT, JOB_RECORD, TASK_PROLOG, TORCH_LIMIT)


def shipped_file(relative: str, package_dir: Path = PACKAGE_DIR) -> Path:
    """RELATIVE in the source checkout around PACKAGE_DIR (it has setup.cfg), else in its data/.

    Raises ShippedFileError naming both places when neither holds the file.
    """
    checkout = package_dir.parent
    candidates = [package_dir / "data" / relative]
    if (checkout / "setup.cfg").is_file():
        candidates.insert(0, checkout / relative)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    raise ShippedFileError(f"{relative} is not part of this slurm-aigc install (looked at {looked})")
