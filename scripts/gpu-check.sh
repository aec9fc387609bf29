#!/usr/bin/env bash
# The real-GPU check (issue 13.4): on a machine with NVIDIA GPUs, reads every GPU through the
# agent's NVML backend (one dry-run poll), parses the real `nvidia-smi topo -m` with the
# `topo show` parser and, where PyTorch is installed in the venv, runs a small load and shows
# its process as the agent sees it; prints one table and exits 1 on any mismatch with
# `nvidia-smi --query-gpu`. No root needed once ./.venv exists (scripts/setup-venv.sh).
#
#   bash scripts/gpu-check.sh [--load|--no-load] [--load-seconds N]
#   (.venv/bin/pip install torch first for the load part)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found on PATH: is the NVIDIA driver installed?" >&2; exit 2; }
BIN=${SLURM_AIGC_BIN:-.venv/bin/slurm-aigc}
if [ ! -x "$BIN" ]; then
    bash scripts/setup-venv.sh
fi
exec "$BIN" gpu-check "$@"
