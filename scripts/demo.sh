#!/usr/bin/env bash
# The main job: as root on Debian 12/13, installs what is missing, brings up a local GPU Slurm
# cluster, installs the hook and policy, replays an AIGC job mix with the daemons, and reports.
# Extra arguments go to `slurm-aigc demo` (e.g. --minutes 3, --cleanup).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec .venv/bin/slurm-aigc demo "$@"
