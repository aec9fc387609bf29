"""slurm-aigc: AIGC-aware GPU scheduling toolkit for Slurm."""

__version__ = "0.1.0"
