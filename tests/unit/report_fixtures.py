"""The report tests' sacct input: the shared 22.05 fixture as slurmctld would hold it after our hook ran.

Reports take a job's class from the hook's AdminComment stamp only (`aigc_class=`), never
from the user's comment. The fixture keeps the class in the comments (a user's `aigc:type=` tag, or a stamp
where the hook used to write it); here each such job gets the AdminComment stamp the hook
writes today, so the figures are grouped by class as on a cluster with the hook installed.
"""

from __future__ import annotations

import json
from pathlib import Path

from slurm_aigc.tags import UNKNOWN_CLASS, comment_tags, stamp, trusted_class

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sacct"


def stamped_sacct(name: str = "sacct-22.05.json") -> str:
    """The fixture's JSON text, the AdminComment stamped from the comment's class where unset."""
    document = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    for job in document["jobs"]:
        comment = job.get("comment") or {}
        text = comment.get("job")
        job_class = trusted_class(text) if trusted_class(text) != UNKNOWN_CLASS else comment_tags(text).get("type")
        if job_class and not comment.get("administrator"):
            comment["administrator"] = stamp(job_class)
    return json.dumps(document)


# The shipped inventory's shards per GPU (etc/slurm-aigc.yaml), which `report` takes from the policy.
SHARDS_PER_GPU = {"a100": 80, "t4": 16}
