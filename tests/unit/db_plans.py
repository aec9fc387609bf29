"""What a database server plans for a statement our code sends: the tests of indexes read it
(EXPLAIN QUERY PLAN on SQLite, EXPLAIN on MariaDB/MySQL and PostgreSQL), never timings."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine


@dataclass(frozen=True)
class Plan:
    """How the plan reads one table: by these indexes ("" for the table itself), and whether it
    then sorts the rows it found (a sort reads every matching row before the first comes out)."""

    indexes: frozenset[str]
    sorts: bool


def sent(engine: Engine, wanted: Callable[[str], bool], action: Callable[[], object]) -> list[tuple[str, Any]]:
    """The statements `action` sends that `wanted` selects, with their parameters."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: object, _cursor: object, statement: str, parameters: Any, _context: object, _many: bool) -> None:
        if wanted(statement):
            seen.append((statement, parameters))
    event.listen(engine, "before_cursor_execute", record)
    try:
        action()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen


def plan(engine: Engine, statement: str, parameters: Any, table: str) -> Plan:
    """The server's plan of `statement` for `table`.

    The servers plan from the table's statistics, gathered first as their background jobs would
    (autovacuum, InnoDB's automatic recalculation). PostgreSQL prefers a scan of a small table:
    its planner is told to avoid one, so the answer says which index it can use, not whether a
    scan would be cheaper on the test's few rows.
    """
    with engine.connect() as connection:
        dialect = connection.dialect.name
        if dialect != "sqlite":
            connection.exec_driver_sql(f"ANALYZE {'TABLE ' if dialect != 'postgresql' else ''}{table}").close()
        if dialect == "sqlite":
            details = [row[-1] for row in connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)]
            mine = [d for d in details if f" {table} " in f"{d} "]
            return Plan(frozenset(d.split(" INDEX ", 1)[1].split()[0] if " INDEX " in d else "" for d in mine),
                        any("TEMP B-TREE" in d for d in details))
        if dialect == "postgresql":
            connection.exec_driver_sql("SET enable_seqscan = off")
            lines = [row[0] for row in connection.exec_driver_sql("EXPLAIN " + statement, parameters)]
            indexes = {re.split(r" (?:using|on) ", line)[1].split()[0] for line in lines
                       if re.search(rf"Index.* (?:using|on) \S+ on {table}\b", line)}
            scans = any(re.search(rf"Seq Scan on {table}\b", line) for line in lines)
            return Plan(frozenset(indexes | ({""} if scans else set())), any("Sort" in line for line in lines))
        rows = connection.exec_driver_sql("EXPLAIN " + statement, parameters).mappings().all()
        mine = [row for row in rows if row["table"] == table]
        return Plan(frozenset(row["key"] or "" for row in mine), any("filesort" in (row["Extra"] or "") for row in rows))
