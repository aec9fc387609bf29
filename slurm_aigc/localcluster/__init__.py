"""A local multi-node GPU Slurm cluster on one machine, with simulated GPUs, for tests and demos."""
