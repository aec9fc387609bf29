"""The one exception hierarchy of slurm-aigc; the CLI maps it to messages and exit codes."""

from __future__ import annotations

from collections.abc import Sequence


class AigcError(Exception):
    """Base of every error slurm-aigc raises on purpose."""

    exit_code = 1


class ConfigError(AigcError):
    """A policy/config file is invalid: names the file, the key path and what was wrong."""

    exit_code = 2

    def __init__(self, source: str, key_path: str, problem: str) -> None:
        self.source = source
        self.key_path = key_path
        self.problem = problem
        where = f"{source}: {key_path}" if key_path else source
        super().__init__(f"{where}: {problem}")


class SlurmCommandError(AigcError):
    """A Slurm command failed: carries argv, exit code and stderr."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        status = "timed out" if returncode is None else f"exited {returncode}"
        super().__init__(f"{' '.join(self.argv)} {status}: {stderr.strip()[:500]}")


class SlurmParseError(AigcError):
    """Output of a Slurm command did not have the shape we asked for."""


class NvmlUnavailableError(AigcError):
    """The NVML library or driver is missing: a start-up error, never a per-poll one."""

    exit_code = 3


class TopologyParseError(AigcError):
    """Input is not a well-formed `nvidia-smi topo -m` matrix."""


class ClusterError(AigcError):
    """The local demo cluster could not be brought up or down."""


class DatabaseError(AigcError):
    """The state database could not be reached or migrated."""


class ShippedFileError(AigcError):
    """A file slurm-aigc ships (default policy, Lua hook, systemd unit) is not in this install."""
