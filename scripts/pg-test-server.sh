#!/usr/bin/env bash
# The suite's PostgreSQL and PgBouncer legs (tests/conftest.py), for scripts/test.sh: installs
# postgresql and pgbouncer when missing, starts a private PostgreSQL and a PgBouncer in
# transaction mode in front of it (docs/deploy.md's settings), both on 127.0.0.1 only, and
# prints the two URLs as shell assignments for `eval`. Idempotent: a running pair is reused.
# As root. Its state: /var/lib/slurm-aigc/pgtest (mode 0700, owned by postgres); `--stop` stops both.
set -euo pipefail
DIR=/var/lib/slurm-aigc/pgtest
PG_PORT=${SLURM_AIGC_PGTEST_PORT:-55433}
BOUNCER_PORT=${SLURM_AIGC_PGBOUNCER_PORT:-56433}
log() { echo "[pgtest] $*" >&2; }
as_postgres() { runuser -u postgres -- "$@"; }

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

if [ "${1:-}" = --stop ]; then
    [ -f "$DIR/pgbouncer.pid" ] && kill "$(cat "$DIR/pgbouncer.pid")" 2>/dev/null || true
    bin=$(pg_bin)
    [ -n "$bin" ] && [ -d "$DIR/data" ] && as_postgres "$bin/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
    exit 0
fi

if [ -z "$(pg_bin)" ] || ! command -v pgbouncer >/dev/null; then
    log "installing postgresql and pgbouncer"
    # The Debian packages start their own server on 5432 where systemd runs; ours is separate.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql pgbouncer >/dev/null
fi
bin=$(pg_bin)
install -d -m 0700 -o postgres -g postgres "$DIR"
if [ ! -f "$DIR/data/PG_VERSION" ]; then
    log "initdb ($bin)"
    head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DIR/password"
    chown postgres:postgres "$DIR/password" && chmod 0600 "$DIR/password"
    as_postgres "$bin/initdb" -D "$DIR/data" -U postgres --pwfile="$DIR/password" -A scram-sha-256 >"$DIR/initdb.log"
fi
password=$(cat "$DIR/password")
if ! as_postgres "$bin/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
    log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
    as_postgres "$bin/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories=$DIR" start >/dev/null
fi
if ! { [ -f "$DIR/pgbouncer.pid" ] && kill -0 "$(cat "$DIR/pgbouncer.pid")" 2>/dev/null; }; then
    log "starting PgBouncer $(pgbouncer --version | head -1 | awk '{print $2}') on 127.0.0.1:$BOUNCER_PORT"
    # tests/unit/test_pgbouncer.py's settings: fewer server connections than its agents.
    cat >"$DIR/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=$PG_PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BOUNCER_PORT
unix_socket_dir =
pool_mode = transaction
ignore_startup_parameters = options
default_pool_size = 4
auth_type = scram-sha-256
auth_file = $DIR/userlist.txt
auth_user = postgres
logfile = $DIR/pgbouncer.log
pidfile = $DIR/pgbouncer.pid
EOF
    printf '"postgres" "%s"\n' "$password" >"$DIR/userlist.txt"
    chown postgres:postgres "$DIR/pgbouncer.ini" "$DIR/userlist.txt" && chmod 0600 "$DIR/userlist.txt"
    as_postgres pgbouncer -d -q "$DIR/pgbouncer.ini"
fi
echo "export SLURM_AIGC_TEST_PG_URL=postgresql+psycopg://postgres:$password@127.0.0.1:$PG_PORT/postgres"
echo "export SLURM_AIGC_TEST_PGBOUNCER_URL=postgresql+psycopg://127.0.0.1:$BOUNCER_PORT"
