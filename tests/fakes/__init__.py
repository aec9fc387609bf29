"""Fakes of the boundaries, for the unit tests and the benchmarks; never part of the installed package.

`nvml`: named fake machines behind a `pynvml` look-alike (`FakeNvml(dgx_a100())`);
`reclaim_slurm`: a Slurm command runner for reclaim's tests (`SlurmCli(runner=FakeSlurm(...))`);
`pynvml_stub/`: a folder holding a `pynvml` module that serves one named fake machine, for a
subprocess that runs the real CLI (put it first on PYTHONPATH; see its docstring).
"""
