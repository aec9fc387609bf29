"""A `pynvml` that serves the fake machine named by $AIGC_FAKE_NVML_MACHINE (tests only).

For a test that runs the real CLI in a subprocess (`slurm-aigc gpu-check`): put this folder
first on PYTHONPATH and the repository root after it, and name a machine of
`tests.fakes.nvml.MACHINES`. `import pynvml` in the package then yields that machine's
`FakeNvml`, so the fake sits at the lowest layer, below the unchanged NVML backend, and the
installed package carries no test switch. The real nvidia-ml-py is loaded first (found on the
rest of sys.path) because the fakes raise its `NVMLError` classes.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder
from importlib.util import module_from_spec

ENV_MACHINE = "AIGC_FAKE_NVML_MACHINE"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_real_pynvml() -> None:
    """Execute nvidia-ml-py's pynvml as sys.modules['pynvml'] (what the fakes import)."""
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]
    spec = PathFinder.find_spec("pynvml", rest)
    if spec is None or spec.loader is None:
        raise ImportError("the pynvml stub needs the real nvidia-ml-py installed")
    real = module_from_spec(spec)
    sys.modules["pynvml"] = real
    spec.loader.exec_module(real)


def _fake() -> object:
    from tests.fakes.nvml import MACHINES, FakeNvml

    name = os.environ.get(ENV_MACHINE, "")
    if name not in MACHINES:
        raise ImportError(f"${ENV_MACHINE}={name!r}: not one of {', '.join(sorted(MACHINES))}")
    return FakeNvml(MACHINES[name]())


_load_real_pynvml()
# What `import pynvml` returns is whatever sys.modules holds once this module has run.
sys.modules[__name__] = _fake()  # type: ignore[assignment]
