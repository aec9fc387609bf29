#!/usr/bin/env bash
# The test command: as root on Debian 12/13, installs what is missing, brings the local
# Slurm cluster up (or reuses it) and runs the whole suite, unit and integration.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup-venv.sh
# The suite runs on the default shape, replacing a cluster left up in another shape (a benchmark's).
export SLURM_AIGC_TEST_SHAPE="${SLURM_AIGC_TEST_SHAPE:-a100:8x2,t4:4x2}"
.venv/bin/slurm-aigc cluster up --shape "$SLURM_AIGC_TEST_SHAPE" --replace
echo "[test] setup and bring-up took $(( $(date +%s) - start )) s" >&2
echo "[test] ruff and mypy --strict" >&2
.venv/bin/ruff check slurm_aigc tests benchmarks
.venv/bin/mypy slurm_aigc
.venv/bin/python -m pytest -p no:cacheprovider -q -rs --durations=15 "$@"
echo "[test] total $(( $(date +%s) - start )) s" >&2
