"""`python -m slurm_aigc`: the same CLI as the `slurm-aigc` command."""

from slurm_aigc.cli.main import main

main()
