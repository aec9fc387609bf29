"""The import contracts stay complete: every module has a layer, and no two modules import each other.

`lint-imports` (scripts/test.sh) checks the layers in `.importlinter`; a module missing from
them would be unchecked, so this test names any module that has no layer yet.
"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Package roots and entry points: the CLI layer covers `slurm_aigc.cli.*`; these hold no logic.
UNLAYERED = {"slurm_aigc", "slurm_aigc.__main__"}


def _layered() -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    lines = config["importlinter:contract:layers"]["layers"].split("\n")
    return [name.strip() for line in lines for name in line.split(":") if name.strip()]


def _modules() -> list[str]:
    names = []
    for path in sorted((ROOT / "slurm_aigc").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            continue  # a package is covered by its modules
        names.append(".".join(parts))
    return names


def test_every_module_is_in_a_layer() -> None:
    layers = _layered()
    unplaced = [m for m in _modules() if m not in UNLAYERED and not any(m == layer or m.startswith(layer + ".") for layer in layers)]
    assert unplaced == [], f"add these modules to a layer in .importlinter: {unplaced}"


def test_no_import_cycles() -> None:
    grimp = pytest.importorskip("grimp")  # comes with import-linter (the test extra)
    graph = grimp.build_graph("slurm_aigc")
    cycles = sorted(
        (a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
        if a < b and graph.find_shortest_chain(importer=b, imported=a)
    )
    assert cycles == []
