#!/usr/bin/env bash
# The test command: as root on Debian 12/13, installs what is missing, brings the local
# Slurm cluster up (or reuses it) and runs the whole suite, unit and integration.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup-venv.sh
.venv/bin/slurm-aigc cluster up
echo "[test] setup and bring-up took $(( $(date +%s) - start )) s" >&2
echo "[test] ruff and mypy --strict" >&2
.venv/bin/ruff check slurm_aigc tests benchmarks
.venv/bin/mypy slurm_aigc
.venv/bin/python -m pytest -p no:cacheprovider -q -rs --durations=15 "$@"
echo "[test] total $(( $(date +%s) - start )) s" >&2
