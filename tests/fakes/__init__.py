"""Fakes of the boundaries, for the unit tests and the benchmarks; never part of the installed package.

`nvml`: named fake machines behind a `pynvml` look-alike (`FakeNvml(dgx_a100())`);
`slurm`: one Slurm command runner keeping nodes and jobs (`SlurmCli(runner=FakeSlurm(nodes, jobs))`);
`pynvml_stub/`: a folder holding a `pynvml` module that serves one named fake machine, for a
subprocess that runs the real CLI (put it first on PYTHONPATH; see its docstring).
"""
