#!/usr/bin/env bash
# Runs the test suite on the OTHER Debian release (bookworm <-> trixie) in a chroot built with
# debootstrap from this machine's Debian mirror, so every CI run covers Slurm 22.05 and 24.11.
#
#   bash scripts/other-release.sh [pytest args...]      (as root; called by scripts/test.sh)
#   bash scripts/other-release.sh --demo [demo args...] (the README's demo, scripts/demo.sh, there;
#                                                        its demo-out/ comes back to $RESULTS/other-release-demo)
#   bash scripts/other-release.sh --run 'COMMAND'       (any shell command in the tree there, e.g. one test
#                                                        with extra output while debugging)
#   bash scripts/other-release.sh --build-only          (build or check the cached chroot)
# SLURM_AIGC_DEBIAN_MIRROR overrides the mirror read from /etc/apt/sources.list*.
#
# - The chroot (debootstrap + the cluster's apt packages) is cached under $CACHE, keyed by the
#   release, the mirror, the package list and the build code; a stale one is removed after a
#   new build. A run mounts it read-only under an overlay, so
#   every run starts from the same pristine tree and nothing a run writes survives it.
# - The suite runs in its own network, UTS, PID and mount namespaces: its cluster's ports, pids,
#   /run (munge socket) and /var/lib/slurm-aigc never meet the host's cluster. The namespace has
#   a veth pair with a private address besides loopback, because Slurm 24.11's daemons resolve
#   their listen address with AI_ADDRCONFIG, which ignores loopback-only hosts.
# - When the PID namespace's first process exits, the kernel kills every process left in it,
#   so no daemon outlives the run; the mount namespace takes /proc, /sys, /dev, /run with it.
#
# Exit status: that of the suite (or demo, or command) inside; 2 when the chroot cannot be built or entered.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TREE=$PWD
CACHE=${SLURM_AIGC_CHROOT_CACHE:-/var/cache/slurm-aigc}
RESULTS=${SLURM_AIGC_RESULTS:-/tmp/slurm-aigc-results}
NS_ADDR=10.213.0.1
NS_PEER=10.213.0.2
NS_HOST=aigc-chroot
APT_ETC=${APT_ETC:-/etc/apt}                                      # tests point these elsewhere
DEBIAN_VERSION_FILE=${DEBIAN_VERSION_FILE:-/etc/debian_version}
# What the chroot needs besides the cluster's own packages (those come from manager.APT_PACKAGES).
BASE_PACKAGES="python3 python3-venv python3-pip ca-certificates git iproute2 procps"

die() { echo "[other-release] FAILED: $*" >&2; exit 2; }
log() { echo "[other-release] $*" >&2; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, namespaces)"
command -v unshare >/dev/null || die "unshare (util-linux) is missing"

host_release() {
    case "$(cut -d. -f1 "$DEBIAN_VERSION_FILE" 2>/dev/null)" in
        12) echo bookworm ;;
        13) echo trixie ;;
        *) die "this is not Debian 12 or 13 ($DEBIAN_VERSION_FILE: $(cat "$DEBIAN_VERSION_FILE" 2>/dev/null || echo none))" ;;
    esac
}

# The first Debian archive URI configured for the host's release (deb822 or one-line format).
debian_mirror() {
    local host=$1 uri
    # Any of the files may be absent (a fresh Debian 13 has only debian.sources): cat's complaint is not an error.
    uri=$({ cat "$APT_ETC"/sources.list "$APT_ETC"/sources.list.d/*.sources "$APT_ETC"/sources.list.d/*.list 2>/dev/null || true; } \
        | awk -v rel="$host" '
            /^URIs:/ { u = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == rel && u != "") { print u; exit } }
            /^deb / { for (i = 3; i <= NF; i++) if ($i == rel && $(i - 1) ~ /^http/) { print $(i - 1); exit } }')
    [ -n "$uri" ] || die "no Debian mirror for $host in /etc/apt/sources.list*"
    echo "$uri"
}

# manager.APT_PACKAGES, read with the system Python (no venv needed on a fresh machine).
cluster_packages() {
    python3 - "$TREE/slurm_aigc/localcluster/manager.py" <<'PY' || die "cannot read APT_PACKAGES from slurm_aigc/localcluster/manager.py"
import ast, sys
for node in ast.parse(open(sys.argv[1]).read()).body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "APT_PACKAGES":
        print(*ast.literal_eval(node.value))
        break
else:
    sys.exit(1)
PY
}

# Local directories pip's configuration and environment name (find-links, file:// indexes).
pip_local_dirs() {
    { cat /etc/pip.conf /root/.config/pip/pip.conf 2>/dev/null; env | grep '^PIP_'; } | tr ' =' '\n\n' \
        | sed -n 's|^file://||; /^\/[A-Za-z0-9._/-]*$/p' | while read -r path; do
            path=${path%/simple}; path=${path%/}
            [ -d "$path" ] && [ "$path" != / ] && echo "$path"
        done | sort -u
}

# Debootstrap + apt-get install into $1.tmp, then rename to $1, so a half-built chroot is never used.
build_chroot() {
    local root=$1 release=$2 mirror=$3 packages=$4 tmp="$1.tmp" started
    started=$(date +%s)
    command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >&2 \
        || die "debootstrap is missing and apt-get could not install it"
    rm -rf "$tmp"
    log "building a $release chroot from $mirror (debootstrap; several minutes, once per package list)"
    debootstrap --variant=minbase --include="${BASE_PACKAGES// /,}" "$release" "$tmp" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log" >&2; rm -rf --one-file-system "$tmp"
             die "debootstrap $release from $mirror failed: is the mirror reachable? (log: $CACHE/debootstrap.log)"; }
    # Debian's postinst scripts would start services; the suite starts its own daemons.
    printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
    chmod 755 "$tmp/usr/sbin/policy-rc.d"
    cp /etc/resolv.conf "$tmp/etc/resolv.conf"
    in_namespaces "$tmp" host-net "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages && apt-get clean" \
        >"$CACHE/apt.log" 2>&1 \
        || { tail -20 "$CACHE/apt.log" >&2; rm -rf --one-file-system "$tmp"
             die "apt-get install in the $release chroot failed (log: $CACHE/apt.log)"; }
    touch "$tmp/.slurm-aigc-complete"
    mv "$tmp" "$root"
    log "built $root in $(( $(date +%s) - started )) s"
    for stale in "$CACHE/chroot-$release"-*; do  # chroots of older package lists or scripts
        [ "$stale" = "$root" ] || { log "removing the stale $stale"; rm -rf --one-file-system "$stale"; }
    done
}

# The working tree as git sees it (tracked and untracked, not ignored files: no host .venv);
# outside a git checkout, everything but the venv and caches.
copy_tree() {
    if git -C "$TREE" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git -C "$TREE" ls-files -z --cached --others --exclude-standard \
            | (cd "$TREE" && tar --null --ignore-failed-read -T - -cf - 2>/dev/null)
    else
        (cd "$TREE" && tar --exclude=./.venv --exclude=__pycache__ --exclude=./.mypy_cache --exclude=./.ruff_cache -cf - .)
    fi | tar -xf - -C "$1"
}

# Runs shell text $3 chrooted in $1 inside new mount+PID namespaces (and, with $2 = own-net, new
# network+UTS namespaces with a veth pair). /proc, /sys, /dev, /dev/pts, /run are mounted in the
# private mount namespace, so they disappear with it.
in_namespaces() {
    local root=$1 net=$2 command=$3 flags=(--mount --pid --fork --propagation private)
    [ "$net" = own-net ] && flags+=(--net --uts)
    unshare "${flags[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 $(env | grep '^PIP_[A-Z_]*=[^ ]*$') \
        ROOT="$root" NET="$net" CGROUP="$CHROOT_CGROUP" NS_ADDR="$NS_ADDR" NS_PEER="$NS_PEER" NS_HOST="$NS_HOST" COMMAND="$command" \
        bash -euc '
        if [ "$NET" = own-net ]; then
            hostname "$NS_HOST"
            ip link set lo up
            ip link add aigc0 type veth peer name aigc1
            ip addr add "$NS_ADDR/24" dev aigc0
            ip addr add "$NS_PEER/24" dev aigc1
            ip link set aigc0 up; ip link set aigc1 up
            # A default route as on a real host (it leads nowhere): the outgoing-interface probe
            # in the metrics tests then finds the private address instead of skipping.
            ip route add default via "$NS_PEER" dev aigc0
        fi
        mount -t proc proc "$ROOT/proc"
        # Read-only kernel settings: package scripts (procps: sysctl --system) must not tune the host.
        mount --bind "$ROOT/proc/sys" "$ROOT/proc/sys"
        mount -o remount,bind,ro "$ROOT/proc/sys"
        mount -t sysfs -o ro sysfs "$ROOT/sys"
        # Slurm 22.05 slurmd will not start without a cgroup filesystem, even with task/none
        # (24.11 does; it is run without one, as it was tested).
        if [ "$CGROUP" = yes ] && mountpoint -q /sys/fs/cgroup; then
            mount --rbind /sys/fs/cgroup "$ROOT/sys/fs/cgroup" && mount -o remount,bind,ro "$ROOT/sys/fs/cgroup"
        fi
        mount --rbind /dev "$ROOT/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$ROOT/dev/shm"
        mount -t devpts -o newinstance,ptmxmode=0666 devpts "$ROOT/dev/pts"
        mount -t tmpfs -o mode=755 tmpfs "$ROOT/run"
        exec chroot "$ROOT" /bin/bash -lc "$COMMAND"'
}

# The command run in the tree inside the chroot for this script's arguments: the suite (pytest
# arguments passed on), the demo (`--demo`, demo arguments passed on) or `--run`'s command as is.
inner_command() {
    case "${1:-}" in
        --demo) shift; echo "bash scripts/demo.sh --out-dir /var/tmp/aigc-results/demo-out$([ $# -gt 0 ] && printf ' %q' "$@")" ;;
        --run) [ $# = 2 ] && [ -n "$2" ] || die "--run takes exactly one command (quote it)"; echo "$2" ;;
        *) echo "bash scripts/test.sh$([ $# -gt 0 ] && printf ' %q' "$@")" ;;
    esac
}

[ "${1:-}" = --functions-only ] && return 0  # tests: `source other-release.sh --functions-only`
[ "${1:-}" = --build-only ] || inner=$(inner_command "$@")  # refuses a bad --run before any work

release=$(host_release)
case "$release" in bookworm) other=trixie ;; trixie) other=bookworm ;; esac
CHROOT_CGROUP=no
[ "$other" = bookworm ] && CHROOT_CGROUP=yes
mirror=${SLURM_AIGC_DEBIAN_MIRROR:-$(debian_mirror "$release")}
packages="$BASE_PACKAGES $(cluster_packages)"
# The key: what the built tree depends on (build_chroot's code, comments stripped by declare -f;
# in_namespaces only mounts for the build, and its mounts do not stay in the tree).
key=$(printf '%s\n' "$other" "$mirror" "$packages" "$(declare -f build_chroot)" | sha256sum | cut -c1-12)
mkdir -p "$CACHE"
root="$CACHE/chroot-$other-$key"
exec 9>"$CACHE/chroot-$other.lock"
flock 9
if [ ! -f "$root/.slurm-aigc-complete" ]; then
    build_chroot "$root" "$other" "$mirror" "$packages"
else
    log "using the cached $other chroot $root"
fi
[ "${1:-}" = --build-only ] && exit 0

run=$(mktemp -d /var/tmp/slurm-aigc-$other.XXXXXX)
merged="$run/merged"
binds=()
cleanup() {
    for bound in "${binds[@]}"; do umount "$bound" 2>/dev/null || umount -l "$bound" 2>/dev/null || true; done
    umount "$merged" 2>/dev/null || umount -l "$merged" 2>/dev/null || true
    rm -rf --one-file-system "$run"  # never into a mount that is still there
}
trap cleanup EXIT
mkdir -p "$run/upper" "$run/work" "$merged"
mount -t overlay overlay -o "lowerdir=$root,upperdir=$run/upper,workdir=$run/work" "$merged" \
    || die "cannot mount an overlay on $root"

mkdir -p "$merged/srv/slurm-aigc"
copy_tree "$merged/srv/slurm-aigc"
[ -f "$merged/srv/slurm-aigc/scripts/test.sh" ] || die "copying the working tree into the chroot failed"
cp /etc/resolv.conf "$merged/etc/resolv.conf"
printf '127.0.0.1 localhost\n%s %s\n' "$NS_ADDR" "$NS_HOST" >"$merged/etc/hosts"
echo "$NS_HOST" >"$merged/etc/hostname"
# pip reaches its index as this machine does: its configuration, its CA bundle (a site's TLS
# proxy CA included) and, read-only, the local wheel directories and indexes it names.
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$merged/etc/pip.conf"
[ -f /root/.config/pip/pip.conf ] && mkdir -p "$merged/root/.config/pip" && cp /root/.config/pip/pip.conf "$merged/root/.config/pip/"
cp /etc/ssl/certs/ca-certificates.crt "$merged/etc/ssl/certs/ca-certificates.crt"
for dir in $(pip_local_dirs); do
    mkdir -p "$merged$dir" && mount --bind -o ro "$dir" "$merged$dir" && binds+=("$merged$dir")
done
# ../shared (trace and topology fixtures the tests read when present), read-only as on the host.
if [ -d "$TREE/../shared" ]; then
    mkdir -p "$merged/srv/shared" && mount --bind -o ro "$TREE/../shared" "$merged/srv/shared" && binds+=("$merged/srv/shared")
fi
# pip's cache survives runs.
mkdir -p "$CACHE/pip-$other" "$merged/root/.cache/pip"
mount --bind "$CACHE/pip-$other" "$merged/root/.cache/pip" && binds+=("$merged/root/.cache/pip")

started=$(date +%s)
log "setting up the venv in the $other chroot (host network, for pip)"
in_namespaces "$merged" host-net "cd /srv/slurm-aigc && bash scripts/setup-venv.sh" \
    || die "scripts/setup-venv.sh failed in the $other chroot"
log "running \`$inner\` in the $other chroot (own network namespace, $NS_HOST = $NS_ADDR)"
set +e
in_namespaces "$merged" own-net \
    "cd /srv/slurm-aigc && export SLURM_AIGC_SKIP_OTHER_RELEASE=1 SLURM_AIGC_SKIP_PG=1 SLURM_AIGC_RESULTS=/var/tmp/aigc-results;
     mkdir -p /var/tmp/aigc-results; $inner; rc=\$?; .venv/bin/slurm-aigc cluster down >/dev/null 2>&1; exit \$rc"
rc=$?
set -e
mkdir -p "$RESULTS"
if [ -d "$merged/var/tmp/aigc-results/demo-out" ]; then
    rm -rf "$RESULTS/other-release-demo" && cp -r "$merged/var/tmp/aigc-results/demo-out" "$RESULTS/other-release-demo"
    log "the demo's output is in $RESULTS/other-release-demo"
fi
if [ "$rc" != 0 ] && [ -d "$merged/var/lib/slurm-aigc/cluster/log" ]; then
    # The chroot goes away with this script: keep the daemons' logs for whoever reads the failure.
    rm -rf "$RESULTS/other-release-logs" && cp -r "$merged/var/lib/slurm-aigc/cluster/log" "$RESULTS/other-release-logs"
    log "the $other cluster's logs are in $RESULTS/other-release-logs"
fi
case "${1:-}" in
    --demo|--run) echo "Debian $other (chroot): \`$inner\` exited $rc" >"$RESULTS/other-release.txt" ;;
    *) cp "$merged/var/tmp/aigc-results/summary.txt" "$RESULTS/other-release.txt" 2>/dev/null \
        || echo "Debian $other (chroot): no result (the suite did not finish)" >"$RESULTS/other-release.txt" ;;
esac
log "the $other part took $(( $(date +%s) - started )) s, exit $rc"
exit "$rc"
