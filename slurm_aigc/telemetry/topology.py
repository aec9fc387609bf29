"""Parse `nvidia-smi topo -m` of every driver era into a link matrix; NVLink islands.

Handles: tab- or space-separated output (old drivers emit tabs, copies often carry the
space-expanded form), the pre-2018 `SOC` legend (read as `SYS`), `CPU Affinity`,
`NUMA Affinity` and `GPU NUMA ID` columns, NIC rows named by device (`mlx5_0`) or as
`NIC#` (renamed by a `NIC Legend` when there is one, kept as `NIC#` when there is none),
`N/A` and empty cells (in the one-tab-per-cell layout an empty cell is an empty field, as
a job restricted to some cores prints an empty CPU Affinity), ANSI underline escapes
around the header (also in their mangled `\\ufffd[4m` form), headers whose whitespace was
collapsed, lost or wrapped onto a second line.

The row labels are the authority on device names: a header must name the same devices
in the same order (joined names such as `GPU0GPU1` are split along the row labels; a
header may stop short of trailing NIC columns, as outputs with many NICs print), the
matrix must be square, symmetric and have `X` on its diagonal. Anything else is a
`TopologyParseError` naming the line and what was wrong, never a silently wrong answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from slurm_aigc.errors import TopologyParseError
from slurm_aigc.telemetry.records import NodeReading


class LinkLevel(IntEnum):
    """How two devices connect, worst (SYS) to best (NV#), as go-gpuallocator orders them."""

    SYS = 0  # across the SMP interconnect between NUMA nodes/sockets (old drivers: SOC)
    NODE = 1  # across host bridges within one NUMA node (drivers >= 396)
    PHB = 2  # through a PCIe host bridge (the CPU)
    PXB = 3  # through several PCIe bridges, not the host bridge
    PIX = 4  # through at most one PCIe bridge
    NV = 5  # a bonded set of NVLinks


@dataclass(frozen=True, order=True)
class Link:
    """One cell of the matrix; orders by level, then by NVLink count (NV12 > NV4 > PIX)."""

    level: LinkLevel
    nvlinks: int = 0

    @property
    def code(self) -> str:
        """The code as today's `nvidia-smi topo -m` prints it."""
        return f"NV{self.nvlinks}" if self.level is LinkLevel.NV else self.level.name


_NV_RE = re.compile(r"^NV(\d+)$")
_LEGACY = {"SOC": "SYS"}  # drivers before ~396 printed SOC for what is now SYS
_P2P_CODES = frozenset({"OK", "CNS", "GNS", "TNS", "NS", "DR", "U"})  # `topo -p2p` legend


def parse_link(code: str) -> Link:
    """`NV12`, `PIX`, `SOC`... -> Link. Raises ValueError for anything else (including `X`)."""
    match = _NV_RE.match(code)
    if match and int(match.group(1)) > 0:
        return Link(LinkLevel.NV, int(match.group(1)))
    name = _LEGACY.get(code, code)
    if name in LinkLevel.__members__ and name != "NV":
        return Link(LinkLevel[name])
    raise ValueError(f"not a topo -m link code: {code!r}")


@dataclass(frozen=True)
class TopoGpu:
    """A GPU row: its index and affinity columns as printed (None when absent, empty, N/A)."""

    index: int
    cpu_affinity: str | None = None
    numa_affinity: str | None = None
    gpu_numa_id: str | None = None


@dataclass(frozen=True)
class TopologyMatrix:
    """A parsed `nvidia-smi topo -m`: GPUs, NICs (by device name) and the links between them."""

    gpus: tuple[TopoGpu, ...]
    nics: tuple[str, ...]
    links: Mapping[str, Mapping[str, Link]] = field(hash=False)

    def link(self, a: str, b: str) -> Link | None:
        """The link between devices `a` and `b` (`GPU0`, `mlx5_0`), None for a==b or unknown."""
        return self.links.get(a, {}).get(b)

    def gpu_link(self, a: int, b: int) -> Link | None:
        """The link between GPU indices `a` and `b`."""
        return self.link(f"GPU{a}", f"GPU{b}")

    def nvlink_islands(self) -> list[list[int]]:
        """GPUs in groups where every pair has its own NV# link; singletons included, all sorted.

        Groups, not connected components: on a DGX-1's hybrid cube-mesh every GPU reaches every
        other over NVLink hops, yet GPU0 and GPU5 share no link, and a 2-GPU job given them
        talks over PCIe and the SMP link. Features built on islands (`nvlink<N>`, `nvfree<k>`)
        promise a direct link between any two GPUs of a group (`nvlink_cliques`).
        """
        indices = [g.index for g in self.gpus]
        edges = [(a, b) for a in indices for b in indices if a < b and _is_nv(self.gpu_link(a, b))]
        return nvlink_cliques(indices, edges)

    def to_json(self) -> dict[str, Any]:
        """The `slurm-aigc topo show --json` document (shape fixed by issue 4)."""
        return {
            "gpus": [{"index": g.index, "cpu_affinity": g.cpu_affinity, "numa_affinity": g.numa_affinity} for g in self.gpus],
            "nics": list(self.nics),
            "links": {a: {b: link.code for b, link in peers.items()} for a, peers in self.links.items()},
            "nvlink_islands": self.nvlink_islands(),
        }


def _is_nv(link: Link | None) -> bool:
    return link is not None and link.level is LinkLevel.NV


def nvlink_cliques(nodes: Iterable[int], edges: Iterable[tuple[int, int]]) -> list[list[int]]:
    """Partition into cliques: the largest clique first (ties: the lowest indices), then again.

    NVSwitch boards are one clique, NV4 quads and bridge pairs are theirs; the DGX-1 cube-mesh
    splits into its two fully linked quads. Exact search (Bron-Kerbosch) is cheap at the 16
    GPUs or fewer a node has.
    """
    left = sorted(set(nodes))
    adjacent: dict[int, set[int]] = {n: set() for n in left}
    for a, b in edges:
        if a != b and a in adjacent and b in adjacent:
            adjacent[a].add(b)
            adjacent[b].add(a)
    groups: list[list[int]] = []
    while left:
        group = _largest_clique(set(left), adjacent)
        groups.append(group)
        left = [n for n in left if n not in group]
    return sorted(groups)


def _largest_clique(nodes: set[int], adjacent: Mapping[int, set[int]]) -> list[int]:
    best: list[int] = []

    def better(clique: list[int]) -> bool:
        return len(clique) > len(best) or (len(clique) == len(best) and clique < best)

    def expand(clique: list[int], candidates: set[int], excluded: set[int]) -> None:
        nonlocal best
        if not candidates and not excluded:
            found = sorted(clique)
            if better(found):
                best = found
            return
        if len(clique) + len(candidates) < len(best):
            return  # cannot beat the best even by taking every candidate
        pivot = max(candidates | excluded, key=lambda n: len(adjacent[n] & candidates))
        for n in sorted(candidates - adjacent[pivot]):
            expand(clique + [n], candidates & adjacent[n], excluded & adjacent[n])
            candidates = candidates - {n}
            excluded = excluded | {n}

    expand([], set(nodes), set())
    return best


# --------------------------------------------------------------------------- parsing

_ANSI_RE = re.compile(r"(?:\x1b|\ufffd)\[[0-9;]*m")
_AFFINITY_COLUMNS = {"CPU Affinity": "cpu_affinity", "NUMA Affinity": "numa_affinity", "GPU NUMA ID": "gpu_numa_id"}
_HEADER_TOKEN_RE = re.compile(r"CPU\s+Affinity|NUMA\s+Affinity|GPU\s+NUMA\s+ID|\S+")
_GPU_LABEL_RE = re.compile(r"^GPU(\d+)$")
_NIC_ALIAS_RE = re.compile(r"^NIC\d+$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_P2P_LEGEND_RE = re.compile(r"^\s*(OK|CNS|GNS|TNS)\s+=")
_MISSING = {"", "N/A"}


@dataclass(frozen=True)
class _Line:
    number: int  # 1-based, for error messages
    text: str


@dataclass(frozen=True)
class _Header:
    devices: tuple[str, ...]  # device tokens as printed (maybe joined: "GPU0GPU1")
    columns: tuple[str, ...]  # affinity column names in order
    column_starts: tuple[int, ...] | None  # tab-expanded start of each device+affinity column
    line: _Line


@dataclass(frozen=True)
class _Row:
    label: str
    cells: tuple[str, ...]  # every token after the label: matrix cells, then affinity values
    cell_starts: tuple[int, ...]  # tab-expanded start column of each cell
    line: _Line
    tab_fields: tuple[str, ...] | None = None  # the cells split on tabs, stripped; None without tabs


def parse_topo_matrix(text: str) -> TopologyMatrix:
    """Parse the text `nvidia-smi topo -m` prints. Raises TopologyParseError naming the damage."""
    lines = _clean_lines(text)
    matrix_lines, legend_lines = _split_legend(lines)
    _reject_p2p(legend_lines)
    header_lines, row_lines = _split_header(matrix_lines)
    header = _parse_header(header_lines)
    rows = [_parse_row(line) for line in row_lines]
    labels = _check_labels(rows)
    _check_header_devices(header, labels)
    links = _parse_links(rows, labels)
    names = _device_names(labels, _nic_legend(legend_lines))
    gpu_rows = [row for row in rows if _GPU_LABEL_RE.match(row.label)]
    tab_cells = all(_tab_field_values(row, len(labels), len(header.columns)) is not None for row in gpu_rows)
    gpus = tuple(_gpu(row, header, len(labels), tab_cells) for row in gpu_rows)
    _check_nic_rows(rows, len(labels))
    nics = tuple(names[label] for label in labels if not _GPU_LABEL_RE.match(label))
    named = {names[a]: {names[b]: link for b, link in peers.items()} for a, peers in links.items()}
    return TopologyMatrix(gpus=gpus, nics=nics, links=named)


def _clean_lines(text: str) -> list[_Line]:
    text = _ANSI_RE.sub("", text.replace("\r", "").lstrip("\ufeff"))
    return [_Line(i + 1, line.rstrip()) for i, line in enumerate(text.split("\n"))]


def _split_legend(lines: list[_Line]) -> tuple[list[_Line], list[_Line]]:
    for position, line in enumerate(lines):
        if line.text.strip() == "Legend:":
            return lines[:position], lines[position + 1 :]
    return lines, []


def _reject_p2p(legend_lines: Sequence[_Line]) -> None:
    for line in legend_lines:
        if _P2P_LEGEND_RE.match(line.text):
            raise TopologyParseError(
                f"line {line.number}: legend {line.text.strip()!r} belongs to `nvidia-smi topo -p2p`, not `topo -m`"
            )


def _is_row(line: _Line) -> bool:
    tokens = line.text.split()
    if len(tokens) < 2:
        return False
    second = tokens[1]
    return second == "X" or second in _P2P_CODES or _is_link_code(second)


def _is_link_code(token: str) -> bool:
    try:
        parse_link(token)
    except ValueError:
        return False
    return True


def _split_header(lines: list[_Line]) -> tuple[list[_Line], list[_Line]]:
    content = [line for line in lines if line.text.strip()]
    if not content:
        raise TopologyParseError("empty input: no `nvidia-smi topo -m` matrix found")
    first_row = next((i for i, line in enumerate(content) if _is_row(line)), None)
    if first_row is None:
        raise TopologyParseError(f"no matrix rows found (line {content[0].number} is {content[0].text.strip()[:60]!r})")
    if first_row == 0:
        raise TopologyParseError(f"line {content[0].number}: matrix row before any header line")
    rows = content[first_row:]
    stray = next((line for line in rows if not _is_row(line)), None)
    if stray is not None:
        raise TopologyParseError(f"line {stray.number}: not a matrix row: {stray.text.strip()[:60]!r}")
    return _drop_preamble(content[:first_row], rows[0].text.split()[0]), rows


def _drop_preamble(header_lines: list[_Line], first_label: str) -> list[_Line]:
    """Lines before the header (a shell prompt, `srun ...`) go; the header names the first row."""
    naming = [i for i, line in enumerate(header_lines) if first_label in line.text]
    return header_lines[naming[-1] :] if naming else header_lines


def _parse_header(lines: list[_Line]) -> _Header:
    # A header wrapped onto several lines is joined; column positions then mean nothing.
    joined = " ".join(line.text for line in lines)
    expanded = joined.expandtabs(8)
    devices: list[str] = []
    columns: list[str] = []
    starts: list[int] = []
    for match in _HEADER_TOKEN_RE.finditer(expanded):
        token = " ".join(match.group(0).split())
        starts.append(match.start())
        if token in _AFFINITY_COLUMNS:
            if token in columns:
                raise TopologyParseError(f"line {lines[0].number}: header names column {token!r} twice")
            columns.append(token)
        elif columns:
            raise TopologyParseError(f"line {lines[0].number}: header column {token!r} after the affinity columns")
        else:
            devices.append(token)
    if not devices:
        raise TopologyParseError(f"line {lines[0].number}: header names no devices: {joined.strip()[:60]!r}")
    return _Header(tuple(devices), tuple(columns), tuple(starts) if len(lines) == 1 else None, lines[0])


def _parse_row(line: _Line) -> _Row:
    expanded = line.text.expandtabs(8)
    spans = [(m.group(0), m.start()) for m in re.finditer(r"\S+", expanded)]
    label = spans[0][0]
    cells = [token for token, _ in spans[1:]]
    starts = [start for _, start in spans[1:]]
    split = [field.strip() for field in line.text.split("\t")]
    fields = tuple(split[1:]) if len(split) > 1 and split[0] == label else None
    return _Row(label, tuple(cells), tuple(starts), line, fields)


def _check_labels(rows: list[_Row]) -> list[str]:
    labels = [row.label for row in rows]
    for position, label in enumerate(labels):
        if label in labels[:position]:
            raise TopologyParseError(f"line {rows[position].line.number}: row {label!r} appears twice")
    if not any(_GPU_LABEL_RE.match(label) for label in labels):
        raise TopologyParseError("the matrix has no GPU rows")
    return labels


def _check_header_devices(header: _Header, labels: list[str]) -> None:
    """The header must name the row labels in row order; joined names are split along them."""
    pending = list(labels)
    for token in header.devices:
        rest = token
        while rest and pending and rest.startswith(pending[0]):
            rest = rest[len(pending.pop(0)) :]
        if rest:
            expected = pending[0] if pending else "nothing more"
            raise TopologyParseError(
                f"line {header.line.number}: header column {token!r} does not match the rows (expected {expected!r})"
            )
    if any(_GPU_LABEL_RE.match(label) for label in pending):
        raise TopologyParseError(f"line {header.line.number}: header lacks columns for rows {', '.join(pending)}")
    # Trailing NIC columns may be missing (many NICs): the rows, checked square and symmetric, name them.


def _parse_links(rows: list[_Row], labels: list[str]) -> dict[str, dict[str, Link]]:
    size = len(labels)
    links: dict[str, dict[str, Link]] = {}
    for row_index, row in enumerate(rows):
        if len(row.cells) < size:
            raise TopologyParseError(
                f"line {row.line.number}: row {row.label} has {len(row.cells)} cells, the matrix needs {size} (truncated?)"
            )
        links[row.label] = _row_links(row, row_index, labels)
    _check_symmetric(rows, links)
    return links


def _row_links(row: _Row, row_index: int, labels: list[str]) -> dict[str, Link]:
    peers: dict[str, Link] = {}
    for column, (label, cell) in enumerate(zip(labels, row.cells)):
        where = f"line {row.line.number}: row {row.label}, column {label}"
        if cell in _P2P_CODES:
            raise TopologyParseError(f"{where}: {cell!r} is a `nvidia-smi topo -p2p` status, this is not `topo -m`")
        if column == row_index:
            if cell != "X":
                raise TopologyParseError(f"{where}: expected X on the diagonal, got {cell!r}")
            continue
        try:
            peers[label] = parse_link(cell)
        except ValueError:
            raise TopologyParseError(f"{where}: {cell!r} is not a link code") from None
    return peers


def _check_symmetric(rows: list[_Row], links: Mapping[str, Mapping[str, Link]]) -> None:
    for row in rows:
        for peer, link in links[row.label].items():
            back = links[peer][row.label]
            if back != link:
                raise TopologyParseError(
                    f"line {row.line.number}: {row.label}-{peer} is {link.code} but {peer}-{row.label} is {back.code}"
                )


def _check_nic_rows(rows: list[_Row], size: int) -> None:
    for row in rows:
        if not _GPU_LABEL_RE.match(row.label) and len(row.cells) > size:
            raise TopologyParseError(f"line {row.line.number}: NIC row {row.label} has values after the matrix")


def _nic_legend(legend_lines: Sequence[_Line]) -> dict[str, str]:
    legend: dict[str, str] = {}
    for line in legend_lines:
        match = _NIC_LEGEND_RE.match(line.text)
        if match:
            legend[match.group(1)] = match.group(2)
    return legend


def _device_names(labels: list[str], legend: Mapping[str, str]) -> dict[str, str]:
    """Row label -> device name: `NIC0` becomes its legend name, others stay."""
    names: dict[str, str] = {}
    for label in labels:
        if _NIC_ALIAS_RE.match(label) and legend:  # no legend at all: the NIC keeps its `NIC#` name
            if label not in legend:
                raise TopologyParseError(f"row {label} has no entry in the NIC Legend (truncated output?)")
            names[label] = legend[label]
        else:
            names[label] = label
    unused = sorted(set(legend) - set(labels))
    if unused:
        raise TopologyParseError(f"NIC Legend names {', '.join(unused)} but the matrix has no such row")
    if len(set(names.values())) != len(names):
        raise TopologyParseError(f"two devices share a name: {sorted(names.values())}")
    return names


def _gpu(row: _Row, header: _Header, size: int, tab_cells: bool) -> TopoGpu:
    match = _GPU_LABEL_RE.match(row.label)
    assert match is not None
    return TopoGpu(index=int(match.group(1)), **_affinity_values(row, header, size, tab_cells))


def _affinity_values(row: _Row, header: _Header, size: int, tab_cells: bool) -> dict[str, str | None]:
    """Map the cells after the matrix to the header's affinity columns.

    `tab_cells`: every GPU row has one tab per cell, so its tab fields are the cells, an
    empty one included. Otherwise values never contain spaces, so n values for n columns
    go in order; fewer values (a truly empty cell) are placed by column position, which is
    only trusted when the row's matrix cells line up with the header.
    """
    extra = row.cells[size:]
    where = f"line {row.line.number}: row {row.label}"
    if len(extra) > len(header.columns):
        raise TopologyParseError(f"{where} has {len(extra)} values after the matrix for {len(header.columns)} column(s)")
    by_field = _tab_field_values(row, size, len(header.columns)) if tab_cells else None
    if by_field is not None:
        placed = list(zip(header.columns, by_field))
    elif len(extra) == len(header.columns):
        placed = list(zip(header.columns, extra))
    else:
        placed = _place_by_position(row, header, size, where)
    result: dict[str, str | None] = dict.fromkeys(_AFFINITY_COLUMNS.values())
    for column, value in placed:
        result[_AFFINITY_COLUMNS[column]] = None if value in _MISSING else value
    return result


def _tab_field_values(row: _Row, size: int, columns: int) -> tuple[str, ...] | None:
    """The values after the matrix when the row has exactly one tab per cell, else None.

    Older drivers print one tab between cells, so an empty cell is an empty field and
    column positions after a wide header name mean nothing. Rows padded with extra tabs
    (more fields than columns: newer drivers pad short values up to the header's width)
    or with empty matrix fields are left to the other rules; one padded GPU row marks the
    whole output as padded, since `0-3\t\t0` alone reads either way.
    """
    fields = row.tab_fields
    if fields is None or len(fields) > size + columns or fields[:size] != row.cells[:size]:
        return None
    tail = fields[size:]
    if any(len(value.split()) > 1 for value in tail):
        return None  # values separated by spaces, not tabs
    return tail


def _place_by_position(row: _Row, header: _Header, size: int, where: str) -> list[tuple[str, str]]:
    extra = row.cells[size:]
    if not extra:
        return []
    starts = header.column_starts
    if starts is None or len(header.devices) != size or not _aligned(row.cell_starts[:size], starts[:size]):
        raise TopologyParseError(
            f"{where} has {len(extra)} value(s) for column(s) {', '.join(header.columns)} "
            "and is not aligned with the header to tell which"
        )
    column_starts = starts[size:]
    placed: list[tuple[str, str]] = []
    for value, start in zip(extra, row.cell_starts[size:]):
        candidates = [i for i, column_start in enumerate(column_starts) if column_start <= start]
        if not candidates or any(column == header.columns[candidates[-1]] for column, _ in placed):
            raise TopologyParseError(f"{where}: value {value!r} does not sit under one affinity column")
        placed.append((header.columns[candidates[-1]], value))
    return placed


def _aligned(cell_starts: Sequence[int], column_starts: Sequence[int]) -> bool:
    """Cells start where their column starts, or one space later (` X ` is centred)."""
    return all(column <= cell <= column + 2 for cell, column in zip(cell_starts, column_starts))


# --------------------------------------------------------------------------- NVML cross-check


def cross_check_nvlink(matrix: TopologyMatrix, reading: NodeReading) -> list[str]:
    """Where `topo -m` and NVML's per-link state (`nvidia-smi nvlink --status`) disagree.

    Rules per GPU (lost GPUs are skipped): the matrix shows NV# links but NVML reports no
    active NVLink; NVML reports active NVLinks but the matrix shows none; the widest NV#
    bond in the row needs more links than NVML reports active (a degraded link). The GPU
    sets themselves must match too.
    """
    problems: list[str] = []
    matrix_indices = {g.index for g in matrix.gpus}
    nvml_indices = {g.index for g in reading.gpus}
    for index in sorted(matrix_indices ^ nvml_indices):
        side = "topo -m" if index in matrix_indices else "NVML"
        problems.append(f"GPU{index} appears only in {side}")
    for gpu in reading.gpus:
        if gpu.lost or gpu.index not in matrix_indices:
            continue
        problems.extend(_gpu_nvlink_problems(matrix, gpu.index, gpu.active_nvlinks))
    return problems


def _gpu_nvlink_problems(matrix: TopologyMatrix, index: int, active: int) -> list[str]:
    bonds = [link.nvlinks for peer in matrix.gpus if (link := matrix.gpu_link(index, peer.index)) and _is_nv(link)]
    widest = max(bonds, default=0)
    if widest and not active:
        return [f"GPU{index}: topo -m shows NV{widest} but NVML reports no active NVLink"]
    if active and not widest:
        return [f"GPU{index}: NVML reports {active} active NVLink(s) but topo -m shows no NV# link"]
    if widest > active:
        return [f"GPU{index}: topo -m shows NV{widest} but NVML reports only {active} active NVLink(s)"]
    return []
