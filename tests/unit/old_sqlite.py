"""A SQLite database limited as SQLite before 3.32 (EL8's) is: 999 bound parameters a statement."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import open_database


def sqlite_with_999_parameters(path: Path) -> sessionmaker[Session]:
    factory = open_database(f"sqlite:///{path}")
    with factory() as session:
        engine = session.get_bind().engine
    engine.dispose()  # the connections made so far have the default limit

    @event.listens_for(engine, "connect")
    def limit(connection: sqlite3.Connection, _record: object) -> None:
        connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)

    return factory
