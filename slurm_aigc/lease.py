"""Leases: however many controllers run against one database, one process runs each part.

A site may keep a standby controller on a second host, or start a second one by mistake.
Without a lease both would act: every action is recorded under a unique key, so none is done
twice, but the rate limits (`max_actions_per_tick`, the publisher's `max_writes_per_cycle`)
count per process and would double, each would settle the other's open intents, and both
would run retention and the learner. Each part (RECLAIM, PUBLISHER, LEARNER) has one row in
`leases` (a dry-run controller's parts have rows of their own, `Leases._key`): a process runs
the part only while it holds that row, renewing it every tick; a row its holder has not renewed
for `reclaim.lease_intervals` ticks (it died, or lost the database) is free to the next taker. A
holder that stops cleanly gives its rows back, so a standby takes over at its next tick.

Why a row and not a server lock: PostgreSQL's advisory locks and MariaDB's GET_LOCK belong to a
session, which PgBouncer's transaction mode (supported, docs/deploy.md) does not keep. A row
updated with a compare-and-set works through any pooler.

Time: expiry is judged by the database server's clock inside each UPDATE (`db.server_now_sql`),
so hosts whose clocks disagree still agree on who holds a part. The holder also keeps a deadline
on its own monotonic clock, started before it asked: `still_held` turns false before the server
would let anyone else take over, so a tick that outlasts the lease stops acting in time.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec

from sqlalchemy import Connection, bindparam, literal_column, select, update
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import Executable
from sqlalchemy.sql.elements import ColumnElement

from slurm_aigc.db import Lease, server_now_sql, transaction
from slurm_aigc.errors import DatabaseError

LOG = logging.getLogger(__name__)
P = ParamSpec("P")

RECLAIM = "reclaim"  # reclaim's ticks (reconcile, judge, act) and the hourly retention
PUBLISHER = "publisher"  # node features and weights
LEARNER = "learner"  # learned defaults for untagged jobs
DRY_RUN_PREFIX = "dry-run "  # a dry-run controller's leases (`Leases._key`)

_HOLDER_LENGTH = 255  # Lease.holder
# The local deadline ends this share of the lease early: room for the round trip that renewed it
# and for an action already started when it passes.
_MARGIN = 0.2
# `still_held` renews once this share of the lease has passed since the last renewal.
_RENEW_AFTER = 0.5
_RENEWED, _TAKEN = "renewed", "taken"  # how `_attempt` got the lease


def process_name() -> str:
    """host:pid:random: unique to this process (a restarted one on the same host is another)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"[-_HOLDER_LENGTH:]


@dataclass(frozen=True)
class Holder:
    """Who holds a part, and for how much longer by the database's clock."""

    part: str
    name: str
    expires_in_s: float

    def describe(self) -> str:
        if not self.name or self.expires_in_s < 0:
            return f"the {self.part} lease is free"
        return f"the {self.part} lease is held by {self.name} for {self.expires_in_s:.0f} s more"


class Leases:
    """The leases of one process. `clock` (tests only): a Unix time standing in for the
    database's clock; None, the database's own."""

    def __init__(self, factory: sessionmaker[Session], lease_s: float, *, name: str | None = None,
                 dry_run: bool = False, clock: Callable[[], float] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._factory = factory
        self.lease_s = lease_s
        self.name = name or process_name()
        self._dry_run = dry_run
        self._clock = clock
        self._monotonic = monotonic
        # By the lease's row key (`_key`): the monotonic time the held lease's renewal was asked.
        self._renewed_at: dict[str, float] = {}
        self._standby_logged: dict[str, str] = {}
        self._why_not: dict[str, str] = {}  # key -> who held it at the last `hold` that failed
        self._renewal_failed: set[str] = set()  # keys whose renewal in `still_held` met a database error

    def set_dry_run(self, dry_run: bool) -> None:
        """The controller's mode changed (SIGHUP): give back the leases of the old mode. The mode
        switches even when the database cannot take them back (they run out on their own): a
        live controller renewing its dry-run row would act beside the live holder."""
        if dry_run == self._dry_run:
            return
        try:
            self.release()
        except DatabaseError as error:
            LOG.warning("%s: could not give back the %s lease(s), which run out in %.0f s: %s", self.name,
                        ", ".join(sorted(self._renewed_at)), self.lease_s, error)
        finally:
            self._renewed_at.clear()
            self._renewal_failed.clear()
            self._dry_run = dry_run

    def _key(self, part: str) -> str:
        """A dry-run controller leases its parts apart from live ones: it changes nothing, so it
        must never keep a live controller standing by (an admin trying a policy in dry-run beside
        the live daemon), yet two dry-run daemons should not both judge and log."""
        return f"{DRY_RUN_PREFIX}{part}" if self._dry_run else part

    def hold(self, part: str) -> bool:
        """Renew the part's lease, or take it when it is free; False: another process holds it."""
        part = self._key(part)
        asked = self._monotonic()
        how, holder = self._attempt(part)
        if how is None and holder is None:  # no row yet: made free, in a transaction of its own
            self._create(part)
            how, holder = self._attempt(part)
        if how is None:
            self._standby(part, holder)
            self._why_not[part] = holder.describe() if holder is not None else f"the {part} lease is not held"
            return False
        if how == _TAKEN:
            self._log_taken(part)
        elif part not in self._renewed_at:  # still ours: only its local deadline had passed (`still_held`)
            LOG.info("%s: renewed the %s lease after its local deadline: running it again", self.name, part)
        self._renewed_at[part] = asked
        self._renewal_failed.discard(part)
        return True

    def why_not(self, part: str) -> str:
        """Who held the part when `hold` last failed for it ('' if it never did)."""
        return self._why_not.get(self._key(part), "")

    def still_held(self, part: str) -> bool:
        """True while this process may still act for the part: before its local deadline, renewing
        the lease once half of it has passed. False for a part never held."""
        key = self._key(part)
        asked = self._renewed_at.get(key)
        if asked is None:
            return False
        elapsed = self._monotonic() - asked
        if elapsed < self.lease_s * _RENEW_AFTER:
            return True
        if elapsed < self.lease_s * (1 - _MARGIN):
            if key in self._renewal_failed:  # one try per renewal: an unreachable database is slow to fail
                return True
            try:
                return self.hold(part)  # False: another process took it, and `_standby` said so
            except DatabaseError as error:
                # The deadline stands whatever the renewal did, so acting on until it passes is safe;
                # judged again now, since a server that stopped answering fails slowly (the read
                # timeout can outlast the lease).
                self._renewal_failed.add(key)
                if self._monotonic() - asked < self.lease_s * (1 - _MARGIN):
                    LOG.warning("%s: could not renew the %s lease, acting on until %.0f s after its last renewal: %s",
                                self.name, key, self.lease_s * (1 - _MARGIN), error)
                    return True
                LOG.warning("%s: could not renew the %s lease: %s", self.name, key, error)
        LOG.warning("%s: the %s lease ran out during the tick: the rest waits for the next", self.name, key)
        self._renewed_at.pop(key, None)
        self._renewal_failed.discard(key)
        return False

    def holder(self, part: str) -> Holder | None:
        """Who holds the part now (None: no process ever took it)."""
        with transaction(self._factory) as session:
            connection = session.connection()
            return self._holder(connection, self._key(part), self._now(connection))

    def release(self) -> None:
        """Give back every lease this process holds (a clean stop): a standby takes over at its next tick."""
        held = sorted(self._renewed_at)
        if not held:
            return
        with transaction(self._factory) as session:
            session.execute(update(Lease).where(Lease.part.in_(held), Lease.holder == self.name).values(expires_at=0.0))
        self._renewed_at.clear()
        self._renewal_failed.clear()
        LOG.info("%s: released the %s lease(s)", self.name, ", ".join(held))

    # ------------------------------------------------------------ statements

    def _now(self, connection: Connection) -> ColumnElement[float]:
        if self._clock is not None:
            return bindparam("now", self._clock())
        return literal_column(server_now_sql(connection.dialect.name))

    def _attempt(self, part: str) -> tuple[str | None, Holder | None]:
        """One transaction: renew the lease, else take it if it has run out; (_RENEWED or _TAKEN,
        None), or (None, the holder: None when the part has no row)."""
        with transaction(self._factory) as session:
            connection = session.connection()
            now = self._now(connection)
            renewed = connection.execute(update(Lease).where(Lease.part == part, Lease.holder == self.name)
                                         .values(expires_at=now + self.lease_s))
            if renewed.rowcount:
                return _RENEWED, None
            taken = connection.execute(update(Lease).where(Lease.part == part, Lease.expires_at < now)
                                       .values(holder=self.name, acquired_at=now, expires_at=now + self.lease_s))
            if taken.rowcount:
                return _TAKEN, None
            return None, self._holder(connection, part, now)

    def _create(self, part: str) -> None:
        """The part's row, free (expired at 0), unless another process made it first.

        Its own transaction: on MariaDB an INSERT IGNORE that finds the row takes a shared lock
        on it, and two processes each holding one while they UPDATE it deadlock (measured: 8
        controllers starting at once on an empty database).
        """
        with transaction(self._factory) as session:
            session.execute(_insert_free(session.get_bind().dialect.name, part))

    @staticmethod
    def _holder(connection: Connection, part: str, now: ColumnElement[float]) -> Holder | None:
        found = _holders(connection, now, part)
        return found[0] if found else None

    # ------------------------------------------------------------ logging

    def _log_taken(self, part: str) -> None:
        self._standby_logged.pop(part, None)
        LOG.warning("%s: took the %s lease: running it from now on", self.name, part)

    def _standby(self, part: str, holder: Holder | None) -> None:
        was_mine = self._renewed_at.pop(part, None) is not None
        self._renewal_failed.discard(part)
        who = holder.name if holder is not None else ""
        if was_mine:
            LOG.warning("%s: lost the %s lease to %s: standing by", self.name, part, who)
        elif self._standby_logged.get(part) != who:  # once per holder, not every tick
            LOG.warning("%s: standing by: %s", self.name,
                        holder.describe() if holder is not None else f"the {part} lease is free")
        self._standby_logged[part] = who


def _insert_free(dialect: str, part: str) -> Executable:
    """INSERT the part's row, free (expired at 0), unless it is there: one statement, no race."""
    values = {"part": part, "holder": "", "acquired_at": 0.0, "expires_at": 0.0}
    if dialect in ("mysql", "mariadb"):
        return mysql.insert(Lease).values(**values).prefix_with("IGNORE")
    if dialect == "postgresql":
        return postgresql.insert(Lease).values(**values).on_conflict_do_nothing(index_elements=["part"])
    return sqlite.insert(Lease).values(**values).on_conflict_do_nothing(index_elements=["part"])



def only_while_held(leases: Leases | None, part: str, run: Callable[P, object]) -> Callable[P, object]:
    """`run`, called only in the ticks in which this process holds the part's lease (None: always)."""
    if leases is None:
        return run

    def gated(*args: P.args, **kwargs: P.kwargs) -> object:
        return run(*args, **kwargs) if leases.hold(part) else None

    return gated


def holders(factory: sessionmaker[Session]) -> list[Holder]:
    """Every lease's holder by the database's clock (`slurm-aigc doctor --role controller`)."""
    with transaction(factory) as session:
        connection = session.connection()
        return _holders(connection, literal_column(server_now_sql(connection.dialect.name)))


def _holders(connection: Connection, now: ColumnElement[float], part: str | None = None) -> list[Holder]:
    query = select(Lease.part, Lease.holder, Lease.expires_at - now).order_by(Lease.part)
    if part is not None:
        query = query.where(Lease.part == part)
    return [Holder(key, name, float(left)) for key, name, left in connection.execute(query)]
