"""`nvidia-smi topo -m` parsing: the shared real captures, our own fixtures, round trips."""

from __future__ import annotations

import itertools
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_aigc.errors import TopologyParseError
from slurm_aigc.telemetry.records import GpuReading, NodeReading, NvLinkState
from slurm_aigc.telemetry.simgpu import sim_topology_text
from slurm_aigc.telemetry.topology import (
    Link,
    LinkLevel,
    cross_check_nvlink,
    nvlink_cliques,
    parse_link,
    parse_topo_matrix,
)

SHARED_TOPO = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "topo"
OWN_TOPO = Path(__file__).resolve().parents[1] / "fixtures" / "topo"
ALL8 = [[0, 1, 2, 3, 4, 5, 6, 7]]
QUADS = [[0, 1, 2, 3], [4, 5, 6, 7]]  # a DGX-1 cube-mesh: GPU0-GPU5 and the like have no link


def singletons(n: int) -> list[list[int]]:
    return [[i] for i in range(n)]


# Verified by hand against each file. links: (a, b, code); gpu: (index, cpu_affinity, numa_affinity).
SHARED_EXPECTED: dict[str, dict[str, Any]] = {
    "4gpu-mlx4_0-soc-legend-tabs-tensorflow-gdr.txt": {
        "nics": ["mlx4_0"], "islands": singletons(4), "links": [("GPU0", "GPU1", "PHB"), ("GPU0", "GPU2", "SYS"), ("GPU2", "mlx4_0", "PHB")],
        "gpu": (2, "6-11", None)},
    "8gpu-pcie-allsys-tabs-gpunumaid.txt": {
        "nics": [], "islands": singletons(8), "links": [("GPU0", "GPU7", "SYS")], "gpu": (7, "16-31,48-63", "1")},
    "a100-sxm4-8gpu-3nic-bond-drv550-gpu-operator.txt": {
        "nics": ["mlx5_0", "mlx5_3", "mlx5_bond_0"], "islands": ALL8,
        "links": [("GPU0", "GPU7", "NV12"), ("GPU0", "mlx5_0", "PXB"), ("GPU4", "mlx5_bond_0", "NODE"), ("mlx5_3", "mlx5_bond_0", "NODE")],
        "gpu": (4, "32-63,96-127", "1")},
    "a6000-1gpu-3nic-ansi-collapsed-sglang.txt": {
        "nics": ["mlx5_2", "mlx5_3", "mlx5_bond_0"], "islands": [[0]],
        "links": [("GPU0", "mlx5_2", "NODE"), ("GPU0", "mlx5_bond_0", "SYS"), ("mlx5_2", "mlx5_3", "PIX")], "gpu": (0, "16-31", "1")},
    "alcf-polaris-4xA100-nv4-2nic-tabs.txt": {
        "nics": ["mlx5_0", "mlx5_1"], "islands": [[0, 1, 2, 3]],
        "links": [("GPU3", "mlx5_0", "PHB"), ("GPU1", "mlx5_1", "PHB"), ("GPU0", "mlx5_0", "SYS")], "gpu": (0, "24-31,56-63", "3")},
    "aws-g6e-12xlarge-4xL40S-node.txt": {
        "nics": [], "islands": singletons(4), "links": [("GPU0", "GPU3", "NODE")], "gpu": (3, "0-47", "0")},
    "aws-p4d-24xlarge-8xA100-nv12.txt": {
        "nics": [], "islands": ALL8, "links": [("GPU3", "GPU4", "NV12")], "gpu": (4, "24-47,72-95", "1")},
    "azure-nv12-2xM60-soc-nolegend-misaligned.txt": {
        "nics": [], "islands": singletons(2), "links": [("GPU0", "GPU1", "SYS")], "gpu": (1, "0-11", None)},
    "dgx1-p100-nv1-4nic-soc-tabs-mangled-header-sharc.txt": {
        "nics": ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"], "islands": QUADS,
        "links": [("GPU0", "GPU4", "NV1"), ("GPU0", "GPU5", "SYS"), ("GPU0", "mlx5_0", "PIX"), ("GPU0", "mlx5_1", "PHB"), ("mlx5_2", "mlx5_3", "PHB")],
        "gpu": (7, "1-1", None)},
    "dgx1-v100-mlx5_0-drv440-oneflow.txt": {
        "nics": ["mlx5_0"], "islands": QUADS, "links": [("GPU0", "GPU3", "NV2"), ("GPU0", "GPU5", "SYS"), ("GPU2", "mlx5_0", "PIX")],
        "gpu": (5, "12-23,36-47", None)},
    "h100-6gpu-2nic-nv18-go-comment.txt": {
        "nics": ["mlx5_0", "mlx5_1"], "islands": [[0, 1, 2, 3, 4, 5]], "links": [("GPU5", "mlx5_1", "SYS"), ("mlx5_0", "mlx5_1", "PIX")],
        "gpu": (3, "48-95,144-191", "1")},
    "h100-sxm-8gpu-nv18-nonic.txt": {"nics": [], "islands": ALL8, "links": [("GPU0", "GPU7", "NV18")], "gpu": (0, "0-47,96-143", "0")},
    "hgx-a100-epyc7763-mlx5_0-drv495-slurm-pleiades.txt": {
        "nics": ["mlx5_0"], "islands": ALL8, "links": [("GPU2", "mlx5_0", "PXB"), ("GPU0", "mlx5_0", "SYS")], "gpu": (4, "112-127", "7")},
    "ibm-minsky-power8-4xP100-nv2-2nic-soc.txt": {
        "nics": ["mlx5_0", "mlx5_1"], "islands": [[0, 1], [2, 3]],
        "links": [("GPU0", "GPU1", "NV2"), ("GPU1", "GPU2", "SYS"), ("mlx5_0", "mlx5_1", "PIX")],
        "gpu": (2, "80-80,88-88,96-96,104-104,112-112,120-120,128-128,136-136,144-144,152-152", None)},
    "nimbix-4gpu-mlx5_0-soc-legend.txt": {
        "nics": ["mlx5_0"], "islands": singletons(4), "links": [("GPU0", "GPU1", "PIX"), ("GPU2", "mlx5_0", "PHB"), ("GPU0", "mlx5_0", "SYS")],
        "gpu": (2, "8-15", None)},
    "p40-8gpu-mlx5_0-soc-legend-tabs-paddle.txt": {
        "nics": ["mlx5_0"], "islands": singletons(8), "links": [("GPU0", "GPU3", "PIX"), ("GPU0", "GPU4", "PXB"), ("GPU7", "mlx5_0", "SYS")],
        "gpu": (7, "0-13", None)},
    "princeton-adroit-4xA100-pcie-node-sys-comma-affinity-tabs.txt": {
        "nics": ["mlx5_0"], "islands": singletons(4), "links": [("GPU0", "GPU1", "NODE"), ("GPU1", "GPU2", "SYS")],
        "gpu": (2, "1,3,5,7,9,11", "1")},
    "princeton-della-4xA100-nv4-mlx5_0-tabs.txt": {
        "nics": ["mlx5_0"], "islands": [[0, 1, 2, 3]], "links": [("GPU2", "mlx5_0", "SYS"), ("GPU0", "GPU3", "NV4")], "gpu": (2, "24-47", "1")},
    "princeton-traverse-power9-slurm-1gpu-4nic-numa-252-255-tabs.txt": {
        "nics": ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"], "islands": [[0]], "links": [("mlx5_2", "mlx5_3", "PIX"), ("GPU0", "mlx5_3", "SYS")],
        "gpu": (0, "0-3", "0,8,252-255")},
    "tesla-p4-1gpu-numa-affinity-na-tabs-hami.txt": {"nics": [], "islands": [[0]], "links": [], "gpu": (0, "0-7", None)},
    "v100-sxm2-8gpu-numa-gpunumaid-lmdeploy.txt": {
        "nics": [], "islands": QUADS, "links": [("GPU0", "GPU1", "NV1"), ("GPU3", "GPU7", "NV1"), ("GPU3", "GPU4", "SYS")],
        "gpu": (6, "20-39,60-79", "1")},
    "workstation-2x-rtx3090-nvlink-bridge-nv4-tabs.txt": {
        "nics": [], "islands": [[0, 1]], "links": [("GPU0", "GPU1", "NV4")], "gpu": (1, "0-23", "0")},
    "workstation-2x-rtx5090-phb-threadripper-tabs.txt": {
        "nics": [], "islands": singletons(2), "links": [("GPU0", "GPU1", "PHB")], "gpu": (0, "0-63", "0")},
}
SHARED_MUST_RAISE = {"workstation-2x-rtx5090-topo-p2p-rw-GNS.txt": "topo -p2p"}

OWN_MUST_RAISE = {
    "damaged-truncated-row.txt": "row GPU2 has 2 cells",
    "damaged-asymmetric.txt": "GPU0-GPU2 is SYS but GPU2-GPU0 is NV4",
    "damaged-nic-legend-missing.txt": "NIC Legend",
    "damaged-glued-cells.txt": "'NV12NV12' is not a link code",
    "damaged-no-diagonal.txt": "expected X on the diagonal",
    "damaged-header-missing-column.txt": "header column 'GPU3'",
    "damaged-collapsed-missing-affinity.txt": "not aligned",
    "damaged-p2p-without-legend.txt": "topo -p2p",
    "not-topo-nvidia-smi-L.txt": "no matrix rows",
    "empty.txt": "empty input",
}

needs_shared = pytest.mark.skipif(not SHARED_TOPO.is_dir(), reason="../shared/fixtures/topo is absent")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@needs_shared
@pytest.mark.shared
def test_every_shared_fixture_has_a_decision() -> None:
    on_disk = {p.name for p in SHARED_TOPO.glob("*.txt")}
    assert on_disk == set(SHARED_EXPECTED) | set(SHARED_MUST_RAISE)


@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("name", sorted(SHARED_EXPECTED))
def test_shared_capture_parses_as_verified_by_hand(name: str) -> None:
    expected = SHARED_EXPECTED[name]
    document = parse_topo_matrix(read(SHARED_TOPO / name)).to_json()
    assert document["nics"] == expected["nics"]
    assert document["nvlink_islands"] == expected["islands"]
    for a, b, code in expected["links"]:
        assert document["links"][a][b] == code
        assert document["links"][b][a] == code
    index, cpu, numa = expected["gpu"]
    assert document["gpus"][index] == {"index": index, "cpu_affinity": cpu, "numa_affinity": numa}


@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("name", sorted(SHARED_EXPECTED))
def test_shared_capture_json_has_exactly_the_issue_shape(name: str) -> None:
    document = parse_topo_matrix(read(SHARED_TOPO / name)).to_json()
    assert list(document) == ["gpus", "nics", "links", "nvlink_islands"]
    gpu_names = [f"GPU{g['index']}" for g in document["gpus"]]
    devices = gpu_names + document["nics"]
    for gpu in document["gpus"]:
        assert set(gpu) == {"index", "cpu_affinity", "numa_affinity"}
        assert gpu["cpu_affinity"] not in ("", "N/A") and gpu["numa_affinity"] not in ("", "N/A")
    assert list(document["links"]) == devices
    for a, peers in document["links"].items():
        assert set(peers) == set(devices) - {a}  # X left out, nothing else missing
        assert not {"X", "SOC"} & set(peers.values())
    flat = sorted(i for island in document["nvlink_islands"] for i in island)
    assert flat == sorted(g["index"] for g in document["gpus"])


@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("name", sorted(SHARED_MUST_RAISE))
def test_shared_non_topo_m_input_raises_naming_the_problem(name: str) -> None:
    with pytest.raises(TopologyParseError, match=SHARED_MUST_RAISE[name]):
        parse_topo_matrix(read(SHARED_TOPO / name))


@needs_shared
@pytest.mark.shared
def test_p2p_matrix_is_refused_even_without_its_legend() -> None:
    text = read(SHARED_TOPO / "workstation-2x-rtx5090-topo-p2p-rw-GNS.txt").split("Legend:")[0]
    with pytest.raises(TopologyParseError, match="GNS"):
        parse_topo_matrix(text)


@pytest.mark.parametrize("name", sorted(OWN_MUST_RAISE))
def test_own_damaged_fixture_raises_naming_the_problem(name: str) -> None:
    with pytest.raises(TopologyParseError, match=OWN_MUST_RAISE[name]):
        parse_topo_matrix(read(OWN_TOPO / name))


def test_own_fixtures_are_all_classified() -> None:
    parsed = {p.name for p in OWN_TOPO.glob("synthetic-*.txt")} | {p.name for p in OWN_TOPO.glob("captured-*.txt")}
    assert {p.name for p in OWN_TOPO.glob("*.txt")} == parsed | set(OWN_MUST_RAISE)


def test_captured_single_h200_with_underlined_header_and_empty_gpu_numa_cell() -> None:
    # Captured on a real H200 (driver 580.159.04, 2026-12-04): ESC[4m underline, tabs, and an
    # empty field before `N/A` in the GPU NUMA ID column.
    matrix = parse_topo_matrix(read(OWN_TOPO / "captured-h200-1gpu.txt"))
    assert matrix.to_json() == {"gpus": [{"index": 0, "cpu_affinity": "0-15", "numa_affinity": "0"}],
                                "nics": [], "links": {"GPU0": {}}, "nvlink_islands": [[0]]}
    assert matrix.gpus[0].gpu_numa_id is None


def test_nic_legend_and_real_ansi_escapes() -> None:
    matrix = parse_topo_matrix(read(OWN_TOPO / "synthetic-dgx-h100-8gpu-4nic-nic-legend-ansi-esc-tabs.txt"))
    document = matrix.to_json()
    assert document["nics"] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert document["links"]["GPU0"]["mlx5_0"] == "PXB"
    assert document["links"]["GPU5"]["mlx5_2"] == "PXB"
    assert document["links"]["mlx5_0"]["mlx5_1"] == "PIX"
    assert document["nvlink_islands"] == ALL8
    assert matrix.gpus[0].gpu_numa_id is None


def test_empty_cell_is_placed_by_column_position() -> None:
    matrix = parse_topo_matrix(read(OWN_TOPO / "synthetic-2x4-nvlink-islands-empty-cpu-affinity-spaces.txt"))
    assert matrix.gpus[5].cpu_affinity is None and matrix.gpus[5].numa_affinity == "1"
    assert matrix.gpus[4].cpu_affinity == "16-31"
    assert matrix.nvlink_islands() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_tab_separated_empty_cpu_affinity_keeps_the_numa_node_in_its_column() -> None:
    """One tab per cell: an empty CPU Affinity (cores outside the job's cpuset) is an empty field."""
    matrix = parse_topo_matrix(read(OWN_TOPO / "synthetic-4gpu-2nic-tabs-empty-cpu-affinity-cgroup.txt"))
    assert [(g.cpu_affinity, g.numa_affinity) for g in matrix.gpus] == [("0-15", "0"), ("0-15", "0"), (None, "1"), (None, "1")]
    assert matrix.nics == ("mlx5_0", "mlx5_1")
    assert matrix.nvlink_islands() == [[0, 1], [2, 3]]


def test_tab_padded_layout_is_not_read_one_field_per_cell() -> None:
    """Drivers that pad short values with extra tabs (`0\t\tN/A`) are placed by column position."""
    text = read(OWN_TOPO / "synthetic-dgx-h100-8gpu-4nic-nic-legend-ansi-esc-tabs.txt")
    text = text.replace("SYS\tSYS\t0-55,112-167\t0\t\tN/A", "SYS\tSYS\t0-3\t\t0", 1)  # GPU0: short CPU set, no NUMA ID
    gpu0 = parse_topo_matrix(text).gpus[0]
    assert (gpu0.cpu_affinity, gpu0.numa_affinity, gpu0.gpu_numa_id) == ("0-3", "0", None)


def test_nic_rows_without_a_nic_legend_keep_their_nic_names() -> None:
    document = parse_topo_matrix(read(OWN_TOPO / "synthetic-a100-8gpu-3nic-no-nic-legend.txt")).to_json()
    assert document["nics"] == ["NIC0", "NIC1", "NIC2"]
    assert document["links"]["GPU4"]["NIC1"] == "PXB" and document["links"]["NIC1"]["NIC2"] == "NODE"
    assert document["gpus"][4] == {"index": 4, "cpu_affinity": "32-63,96-127", "numa_affinity": "1"}


def test_more_nic_rows_than_header_columns_are_read_by_their_row_labels() -> None:
    matrix = parse_topo_matrix(read(OWN_TOPO / "synthetic-4gpu-10nic-no-nic-legend-short-header.txt"))
    assert matrix.nics == tuple(f"NIC{i}" for i in range(10))
    assert matrix.link("GPU1", "NIC9") == Link(LinkLevel.PXB) and matrix.link("NIC8", "NIC9") == Link(LinkLevel.PIX)
    assert [(g.cpu_affinity, g.numa_affinity) for g in matrix.gpus][2:] == [("32-63", "1"), ("32-63", "1")]


def test_header_lacking_a_gpu_column_is_still_refused() -> None:
    text = read(OWN_TOPO / "synthetic-4gpu-10nic-no-nic-legend-short-header.txt").replace("GPU3    NIC0", "NIC0", 1)
    with pytest.raises(TopologyParseError, match="header column 'NIC0'"):
        parse_topo_matrix(text)


def test_shell_prompt_before_the_header_is_ignored() -> None:
    text = "user@gpu01:~$ srun --gres=gpu:4 nvidia-smi topo -m\n" + sim_topology_text(4, nvlink=True)
    assert parse_topo_matrix(text) == parse_topo_matrix(sim_topology_text(4, nvlink=True))


def test_wrapped_header_is_joined() -> None:
    matrix = parse_topo_matrix(read(OWN_TOPO / "synthetic-p4d-wrapped-header.txt"))
    assert [g.gpu_numa_id for g in matrix.gpus] == [None] * 8
    assert matrix.gpus[7].numa_affinity == "1"
    assert matrix.nvlink_islands() == ALL8


# --------------------------------------------------------------------------- links and islands


def test_link_levels_are_ordered_best_last() -> None:
    order = [parse_link(c) for c in ("SYS", "NODE", "PHB", "PXB", "PIX", "NV1", "NV4", "NV12", "NV18")]
    assert order == sorted(order)
    assert parse_link("SOC") == Link(LinkLevel.SYS)
    assert parse_link("NV12").code == "NV12"


@pytest.mark.parametrize("code", ["X", "NV0", "NV", "GNS", "sys", ""])
def test_bad_link_codes_are_refused(code: str) -> None:
    with pytest.raises(ValueError):
        parse_link(code)


def test_nvlink_cliques_sorted_with_singletons() -> None:
    assert nvlink_cliques([5, 3, 1, 0, 2], [(5, 3), (2, 0)]) == [[0, 2], [1], [3, 5]]


def test_a_chain_of_links_is_not_one_island() -> None:
    # 0-1-2 linked in a line: 0 and 2 share no link, so a 2-GPU job on them would cross PCIe.
    assert nvlink_cliques(range(3), [(0, 1), (1, 2)]) == [[0, 1], [2]]


def test_cube_mesh_splits_into_its_fully_linked_quads() -> None:
    quads = [(a, b) for q in (range(4), range(4, 8)) for a in q for b in q if a < b]
    cross = [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert nvlink_cliques(range(8), quads + cross) == QUADS


def test_largest_clique_is_taken_first_wherever_it_is() -> None:
    # 0-1 linked, and 2-3-4 all linked: the triangle is an island although 0 comes first.
    assert nvlink_cliques(range(5), [(0, 1), (2, 3), (3, 4), (2, 4), (1, 2)]) == [[0, 1], [2, 3, 4]]


# --------------------------------------------------------------------------- round trips


def render(links: dict[tuple[int, int], str], n: int, tabs: bool, affinity: list[tuple[str, str]]) -> str:
    """A `topo -m` text in either layout, from a symmetric link map."""
    sep = "\t" if tabs else " " * 4
    header = sep + sep.join([f"GPU{i}" for i in range(n)] + ["CPU Affinity", "NUMA Affinity"])
    rows = [header]
    for a in range(n):
        cells = [" X " if a == b else links[(min(a, b), max(a, b))] for b in range(n)]
        rows.append(sep.join([f"GPU{a}", *cells, *affinity[a]]))
    return "\n".join(rows) + "\n"


codes = st.sampled_from(["SYS", "SOC", "NODE", "PHB", "PXB", "PIX", "NV1", "NV2", "NV4", "NV12", "NV18"])


@st.composite
def matrices(draw: st.DrawFn) -> tuple[int, dict[tuple[int, int], str], bool, list[tuple[str, str]]]:
    n = draw(st.integers(min_value=1, max_value=8))
    links = {(a, b): draw(codes) for a in range(n) for b in range(a + 1, n)}
    tabs = draw(st.booleans())
    cpu_choices = ["{}", ""] if tabs else ["{}"]  # one tab per cell: an empty CPU Affinity is an empty field
    affinity = [
        (draw(st.sampled_from(cpu_choices)).format(f"{i * 4}-{i * 4 + 3}"), draw(st.sampled_from(["0", "1", "N/A"])))
        for i in range(n)
    ]
    return n, links, tabs, affinity


@settings(max_examples=60, deadline=None)
@given(matrices())
def test_rendered_matrix_parses_back(case: tuple[int, dict[tuple[int, int], str], bool, list[tuple[str, str]]]) -> None:
    n, links, tabs, affinity = case
    matrix = parse_topo_matrix(render(links, n, tabs, affinity))
    for (a, b), code in links.items():
        assert matrix.gpu_link(a, b) == parse_link(code)
    assert [g.numa_affinity for g in matrix.gpus] == [None if v == "N/A" else v for _, v in affinity]
    assert [g.cpu_affinity for g in matrix.gpus] == [v or None for v, _ in affinity]
    nv_pairs = {(a, b) for (a, b), code in links.items() if code.startswith("NV")}
    islands = matrix.nvlink_islands()
    assert sorted(i for island in islands for i in island) == list(range(n))
    for island in islands:  # every two GPUs of an island have their own NVLink
        assert all((a, b) in nv_pairs for a in island for b in island if a < b)
    largest = max(len(island) for island in islands)
    cliques = [c for size in range(1, n + 1) for c in itertools.combinations(range(n), size)
               if all((a, b) in nv_pairs for a, b in itertools.combinations(c, 2))]
    assert largest == max(len(c) for c in cliques)  # no bigger fully linked group was missed


@pytest.mark.parametrize(("n", "nvlink"), [(1, False), (2, True), (4, False), (8, True), (8, False)])
def test_sim_topology_text_parses(n: int, nvlink: bool) -> None:
    matrix = parse_topo_matrix(sim_topology_text(n, nvlink))
    assert [g.index for g in matrix.gpus] == list(range(n))
    expected = [list(range(n))] if nvlink else singletons(n)
    assert matrix.nvlink_islands() == expected
    if n == 8 and not nvlink:
        assert matrix.gpu_link(0, 3) == Link(LinkLevel.PIX) and matrix.gpu_link(0, 4) == Link(LinkLevel.SYS)
        assert matrix.gpus[4].numa_affinity == "1" and matrix.gpus[4].cpu_affinity == "16-31"


# --------------------------------------------------------------------------- NVML cross-check


def reading(links_per_gpu: list[int], lost: int | None = None) -> NodeReading:
    from datetime import datetime

    gpus = tuple(
        GpuReading(index=i, lost=(i == lost), nvlink=tuple(NvLinkState(k, True) for k in range(count)))
        for i, count in enumerate(links_per_gpu)
    )
    return NodeReading("n", datetime(2026, 1, 1, tzinfo=UTC), "550", gpus)


def test_cross_check_agrees_on_a_healthy_nvswitch_board() -> None:
    matrix = parse_topo_matrix(sim_topology_text(4, nvlink=True))
    assert cross_check_nvlink(matrix, reading([12, 12, 12, 12])) == []


def test_cross_check_reports_degraded_missing_and_extra_links() -> None:
    nvlinked = parse_topo_matrix(sim_topology_text(3, nvlink=True))
    problems = cross_check_nvlink(nvlinked, reading([12, 8, 0]))
    assert problems == [
        "GPU1: topo -m shows NV12 but NVML reports only 8 active NVLink(s)",
        "GPU2: topo -m shows NV12 but NVML reports no active NVLink",
    ]
    pcie = parse_topo_matrix(sim_topology_text(2, nvlink=False))
    assert cross_check_nvlink(pcie, reading([0, 4])) == ["GPU1: NVML reports 4 active NVLink(s) but topo -m shows no NV# link"]


def test_cross_check_names_gpus_seen_by_one_side_and_skips_lost_ones() -> None:
    matrix = parse_topo_matrix(sim_topology_text(2, nvlink=True))
    assert cross_check_nvlink(matrix, reading([12, 0, 12], lost=1)) == ["GPU2 appears only in NVML"]
