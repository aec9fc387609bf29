#!/usr/bin/env bash
# The test command: as root on Debian 12/13, installs what is missing, brings the local
# Slurm cluster up (or reuses it) and runs the whole suite, unit and integration; then runs the
# suite again on the other Debian release in a chroot (scripts/other-release.sh), so each run
# covers Slurm 22.05 (bookworm) and 24.11 (trixie). Extra arguments go to pytest, in both parts.
# SLURM_AIGC_SKIP_OTHER_RELEASE=1 runs this machine's part only (the chroot sets it inside).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
RESULTS=${SLURM_AIGC_RESULTS:-/tmp/slurm-aigc-results}
export SLURM_AIGC_RESULTS=$RESULTS
rm -rf "$RESULTS" && mkdir -p "$RESULTS"
bash scripts/setup-venv.sh
# The suite runs on the default shape, replacing a cluster left up in another shape (a benchmark's).
export SLURM_AIGC_TEST_SHAPE="${SLURM_AIGC_TEST_SHAPE:-a100:8x2,t4:4x2}"
.venv/bin/slurm-aigc cluster up --shape "$SLURM_AIGC_TEST_SHAPE" --replace
# The PostgreSQL and PgBouncer legs (tests/conftest.py): this machine's part only. The chroot's
# suite (SLURM_AIGC_SKIP_PG=1 from scripts/other-release.sh) has no network to install them and
# skips them. A server that cannot be started fails the run after the suite, which skips its legs.
pg=0
if [ -z "${SLURM_AIGC_SKIP_PG:-}" ]; then
    if pg_env=$(bash scripts/pg-test-server.sh); then
        eval "$pg_env"
    else
        pg=1
        echo "[test] scripts/pg-test-server.sh failed: the PostgreSQL and PgBouncer legs skip, and the run fails" >&2
    fi
fi
echo "[test] setup and bring-up took $(( $(date +%s) - start )) s" >&2
set +e
echo "[test] ruff and mypy --strict" >&2
.venv/bin/ruff check slurm_aigc tests benchmarks && .venv/bin/mypy slurm_aigc && .venv/bin/lint-imports --no-cache
lint=$?
.venv/bin/python -m pytest -p no:cacheprovider -q -rs --durations=15 --junitxml="$RESULTS/junit.xml" "$@"
suite=$?  # 5 (no tests collected) is a failure like any other non-zero exit
set -e
.venv/bin/python - "$RESULTS/junit.xml" "$suite" "$lint" "$(( $(date +%s) - start ))" >"$RESULTS/summary.txt" <<'EOF'
import platform, subprocess, sys, xml.etree.ElementTree as ET
junit, suite, lint, seconds = sys.argv[1:]
try:
    s = ET.parse(junit).getroot()
    s = s if s.tag == "testsuite" else s.find("testsuite")
    n = {k: int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts = (f"{n['tests'] - n['failures'] - n['errors'] - n['skipped']} passed, {n['failures']} failed, "
              f"{n['errors']} errors, {n['skipped']} skipped")
except (OSError, ET.ParseError, AttributeError):
    counts = "no results"
os_release = dict(line.split("=", 1) for line in open("/etc/os-release").read().split("\n") if "=" in line)
slurm = subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout.split()[-1:] or ["?"]
verdict = "PASS" if suite == "0" and lint == "0" else "FAIL"
print(f"{verdict}: Debian {open('/etc/debian_version').read().strip()} ({os_release.get('VERSION_CODENAME', '?')}), "
      f"Slurm {slurm[0]}, Python {platform.python_version()}: {counts}; pytest exit {suite}, "
      f"ruff+mypy exit {lint}, {seconds} s")
EOF
other=0
if [ -z "${SLURM_AIGC_SKIP_OTHER_RELEASE:-}" ]; then
    set +e
    bash scripts/other-release.sh "$@"
    other=$?
    set -e
fi
echo "[test] total $(( $(date +%s) - start )) s" >&2
echo "[test] results:" >&2
sed 's/^/[test]   this machine: /' "$RESULTS/summary.txt" >&2
if [ -z "${SLURM_AIGC_SKIP_OTHER_RELEASE:-}" ]; then
    { cat "$RESULTS/other-release.txt" 2>/dev/null || echo "FAIL: scripts/other-release.sh exited $other before the suite ran"; } \
        | sed 's/^/[test]   other release: /' >&2
fi
[ "$suite" = 0 ] && [ "$lint" = 0 ] && [ "$other" = 0 ] && [ "$pg" = 0 ]
