#!/usr/bin/env bash
# Creates ./.venv with slurm-aigc and its test tools installed (editable). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "slurm-aigc needs Python >= 3.11 ($PYTHON is $("$PYTHON" --version 2>&1))" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv" >&2
    "$PYTHON" -m venv .venv || { apt-get install -y -q python3-venv >&2 && "$PYTHON" -m venv .venv; }
fi
# mysql: the integration tests and every store's tests also run on the local cluster's MariaDB;
# postgresql: and on scripts/pg-test-server.sh's PostgreSQL and PgBouncer.
EXTRAS='.[test,mysql,postgresql]'
# The install is editable, so only a change of the requirements needs pip again: skipping it
# keeps a second run off the network (the other-release chroot runs its suite without one).
stamp=$(cat setup.cfg pyproject.toml <(echo "$EXTRAS") | sha256sum | cut -c1-16)
if [ "$(cat .venv/.slurm-aigc-setup 2>/dev/null)" = "$stamp" ] && [ -x .venv/bin/slurm-aigc ]; then
    echo "[setup] .venv up to date (setup.cfg unchanged)" >&2
    exit 0
fi
echo "[setup] pip install -e '$EXTRAS'" >&2
.venv/bin/pip install --progress-bar off -q -e "$EXTRAS"
echo "$stamp" >.venv/.slurm-aigc-setup
