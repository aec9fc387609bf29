"""GPU reports: sacct allocations joined with slurm-aigc's samples and audit trail."""
