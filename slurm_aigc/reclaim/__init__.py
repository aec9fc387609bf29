"""Idle-GPU reclamation and right-sizing.

`config` reads the `reclaim:` policy section, `detect` turns sample windows into verdicts
(pure), `ladder` plans the next action per job (pure), `actuator` is the one place that
applies actions through Slurm and records them, `controller` runs one tick of all that.
"""
