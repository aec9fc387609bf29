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
# mysql: the integration tests and every store's tests also run on the local cluster's MariaDB.
echo "[setup] pip install -e '.[test,mysql]'" >&2
.venv/bin/pip install --progress-bar off -q -e '.[test,mysql]'
