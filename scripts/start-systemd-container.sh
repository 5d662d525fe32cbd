#!/usr/bin/env bash
# start-systemd-container.sh — a Debian 12 machine with systemd as PID 1 in a
# systemd-nspawn container, with rackguard installed in it by the install steps of
# docs/operations.md, run as written; for tests/systemd/test_real_systemd.py.
#
# The Debian image is made once by debootstrap into CACHE/systemd-<hash of its
# recipe> and never changed: each container is an overlay on it (DIR/upper). The
# container shares the host's network (no --private-network), so the daemon's API
# and a webhook receiver on the host's loopback reach each other. As root; never
# reads stdin; idempotent:
#   - the container recorded in DIR runs, from the same image and sources: only
#     re-print the environment;
#   - it is stopped (scripts/stop-systemd-container.sh) but DIR holds its install
#     from the same image and sources: boot it again, its state kept (a reboot);
#   - otherwise: a fresh overlay, boot, install as docs/operations.md says.
#
# Usage:  eval "$(scripts/start-systemd-container.sh [DIR])"  (DIR default /tmp/rackguard-systemd)
#
# stdout: KEY=VALUE lines (also in DIR/env.sh):
#   SYSTEMD_CT_PID (the container's systemd, for nsenter -t PID -a), SYSTEMD_CT_NSPAWN_PID,
#   SYSTEMD_CT_DIR, SYSTEMD_CT_ROOT (its / seen from the host), SYSTEMD_CT_API_PORT
#   (the daemon's API on 127.0.0.1), SYSTEMD_CT_WEBHOOK_KEY_FILE (the key installed as
#   /etc/rackguard/webhook.key), SYSTEMD_CT_INSTALL_SH (the doc's block that was run),
#   SYSTEMD_CT_INSTALL_LOG (its trace), SYSTEMD_CT_BOOTED (fresh|rebooted|running)
# stderr: progress, with the seconds each phase took.
#
# Environment (defaults):
#   SYSTEMD_CT_CACHE=/var/cache/rackguard   SYSTEMD_CT_MIRROR=http://deb.debian.org/debian
#   SYSTEMD_CT_PYTHON=<checkout>/.venv/bin/python (builds the wheels)
#   SYSTEMD_CT_INSTALL=1 (run install-systemd-container.sh when a tool is missing)
#   SYSTEMD_CT_TIMEOUT=120 (seconds for the boot and for the install)
#
# The node runs simulated GPUs: no GPU here. The rackguard-sim wheel is unpacked
# into /opt/rackguard-sim (not into the node's venv), and a drop-in,
# rackguard.service.d/50-simulated-node.conf, runs the installed venv's python with
# `-m fakes.nvml_module` (docs/operations.md, "A simulated node"), the fake NVML's
# temperature read from /run/rackguard-sim/temperature. Everything else is the
# shipped unit.
set -euo pipefail
exec </dev/null

SELF=$(cd "$(dirname "$0")" && pwd -P)
ROOT=$(cd "$SELF/.." && pwd -P)
DIR=${1:-/tmp/rackguard-systemd}
CACHE=${SYSTEMD_CT_CACHE:-/var/cache/rackguard}
MIRROR=${SYSTEMD_CT_MIRROR:-http://deb.debian.org/debian}
PY=${SYSTEMD_CT_PYTHON:-$ROOT/.venv/bin/python}
TIMEOUT=${SYSTEMD_CT_TIMEOUT:-120}
MACHINE=rackguard-ct

log() { printf '[start-systemd-container] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, mount, systemd-nspawn)"
if [ "${SYSTEMD_CT_INSTALL:-1}" = 1 ]; then "$SELF/install-systemd-container.sh"; fi
for b in debootstrap systemd-nspawn nsenter flock mountpoint sha256sum; do
  command -v "$b" >/dev/null 2>&1 || die "$b not installed (run scripts/install-systemd-container.sh)"
done
[ -x "$PY" ] || die "no python at $PY to build the wheels (make setup, or set SYSTEMD_CT_PYTHON)"

# ---- image recipe (a change anywhere in this section makes a new image)
SUITE=bookworm
# procps: /bin/kill, the unit's ExecReload. python3-venv: the doc's `python3 -m venv`.
PACKAGES=systemd,systemd-sysv,dbus,procps,python3,python3-venv
build_image() {  # build_image DEST: debootstrap into DEST.tmp, then rename
  local tmp=$1.tmp
  rm -rf "$tmp"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" "$MIRROR" >"$1.log" 2>&1 ||
    { tail -20 "$1.log" >&2; die "debootstrap failed (log: $1.log)"; }
  echo "$MACHINE" >"$tmp/etc/hostname"
  printf '127.0.0.1 localhost %s\n::1 localhost\n' "$MACHINE" >"$tmp/etc/hosts"
  rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
  mv "$tmp" "$1"
}
# ---- end of image recipe

mkdir -p "$CACHE" "$DIR"
DIR=$(cd "$DIR" && pwd -P)
chmod 700 "$DIR"  # the install's trace shows the test's webhook key
RECIPE=$(sed -n '/^# ---- image recipe/,/^# ---- end of image recipe/p' "$0" | sha256sum | cut -c1-12)
IMAGE=$CACHE/systemd-$RECIPE
# What is installed: the sources of both wheels, the pins, the doc, the unit.
SOURCES=$(cd "$ROOT" && find daemon adapters policies fakes rackguard-sim pyproject.toml \
  constraints.txt docs/operations.md systemd scripts/*systemd-container* \
  \( -name __pycache__ -o -name '*.egg-info' -o -name build \) -prune -o \
  \( -type f -o -type l \) -print | LC_ALL=C sort | xargs -d '\n' sha256sum | sha256sum | cut -c1-12)
SETTINGS="image=$RECIPE sources=$SOURCES"
ROOTFS=$DIR/root

ct_pid() {  # the container's systemd (PID 1 inside), a child of the recorded nspawn
  local np
  np=$(cat "$DIR/nspawn.pid" 2>/dev/null) || return 1
  [ "$(cat "/proc/$np/comm" 2>/dev/null)" = systemd-nspawn ] || return 1
  local stat
  for stat in /proc/[0-9]*/stat; do  # fields 2 and 4: (comm) and the parent's PID
    awk -v np="$np" '$2 == "(systemd)" && $4 == np { print $1; found = 1 } END { exit !found }' \
      "$stat" 2>/dev/null && return 0
  done
  return 1
}
inct() {  # run a command in the container, with its environment, not the host's
  nsenter -t "$CT" -a env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 "$@"
}
print_env() {
  cat >"$DIR/env.sh" <<ENV
SYSTEMD_CT_PID=$CT
SYSTEMD_CT_NSPAWN_PID=$(cat "$DIR/nspawn.pid")
SYSTEMD_CT_DIR=$DIR
SYSTEMD_CT_ROOT=$ROOTFS
SYSTEMD_CT_API_PORT=$(cat "$DIR/api_port")
SYSTEMD_CT_WEBHOOK_KEY_FILE=$DIR/webhook.key
SYSTEMD_CT_INSTALL_SH=$DIR/install.sh
SYSTEMD_CT_INSTALL_LOG=$DIR/install.log
SYSTEMD_CT_BOOTED=$1
ENV
  cat "$DIR/env.sh"
}
boot() {  # boot the container on ROOTFS and wait until its systemd has started everything
  local t0 state
  t0=$(now)
  mountpoint -q "$ROOTFS" ||
    mount -t overlay overlay -o "lowerdir=$IMAGE,upperdir=$DIR/upper,workdir=$DIR/work" "$ROOTFS"
  # setsid: the container outlives the shell or test that started it, until stopped.
  setsid systemd-nspawn --register=no --keep-unit --machine="$MACHINE" -D "$ROOTFS" -b \
    --console=pipe --bind-ro="$DIR/wheels:/root/install/wheels" </dev/null >"$DIR/console.log" 2>&1 &
  echo $! >"$DIR/nspawn.pid"
  CT=
  for _ in $(seq 1 $((TIMEOUT * 10))); do
    CT=$(ct_pid) && [ -n "$CT" ] && break
    kill -0 "$(cat "$DIR/nspawn.pid")" 2>/dev/null || { tail -20 "$DIR/console.log" >&2; die "systemd-nspawn exited"; }
    sleep 0.1
  done
  [ -n "$CT" ] || die "no systemd in the container after ${TIMEOUT}s (see $DIR/console.log)"
  state=
  for _ in $(seq 1 $((TIMEOUT * 10))); do  # --wait, once its bus answers
    state=$(timeout "$TIMEOUT" nsenter -t "$CT" -a systemctl is-system-running --wait 2>/dev/null) || true
    case $state in running | degraded | maintenance | stopping) break ;; esac
    sleep 0.1
  done
  if [ "$state" != running ]; then
    inct systemctl --failed --no-pager >&2 || true
    [ "$1" = reboot ] && [ "$state" = degraded ] || die "the container's systemd is '$state', not running"
  fi
  log "booted in $(since "$t0")s: systemd is $state (container PID $CT)"
}

# ---- already running, from the same image and sources
if [ "$(cat "$DIR/settings" 2>/dev/null)" = "$SETTINGS" ] && CT=$(ct_pid) && [ -n "$CT" ]; then
  log "already running under $DIR"
  print_env running
  exit 0
fi
# ---- installed and stopped: boot it again, state kept
if [ "$(cat "$DIR/settings" 2>/dev/null)" = "$SETTINGS" ] && [ -e "$DIR/installed" ]; then
  SYSTEMD_CT_PURGE=0 "$SELF/stop-systemd-container.sh" "$DIR"
  boot reboot
  print_env rebooted
  exit 0
fi

# ---- fresh
T0=$(now)
SYSTEMD_CT_PURGE=0 "$SELF/stop-systemd-container.sh" "$DIR"
mountpoint -q "$ROOTFS" && die "$ROOTFS is still mounted"
rm -rf "$DIR/upper" "$DIR/work" "$DIR/root" "$DIR/wheels" "$DIR/build" "$DIR/installed" "$DIR/settings"
mkdir -p "$DIR/upper" "$DIR/work" "$ROOTFS" "$DIR/wheels" "$DIR/build"
trap 'rc=$?; if [ $rc -ne 0 ]; then log "bring-up failed (rc=$rc); stopping it"; SYSTEMD_CT_PURGE=0 "$SELF/stop-systemd-container.sh" "$DIR"; fi' EXIT

# The image: built once per recipe, by one process at a time.
exec 9>"$CACHE/systemd.lock"
flock -w 900 9 || die "another bring-up holds $CACHE/systemd.lock"
if [ ! -d "$IMAGE" ]; then
  t=$(now)
  log "debootstrap $SUITE ($PACKAGES) into $IMAGE"
  build_image "$IMAGE"
  log "image built in $(since "$t")s ($(du -sh "$IMAGE" | cut -f1))"
fi

# The wheels, built on the host from this checkout: the agent (named as the doc
# names it), its dependencies at the pinned versions (cached per pin set; the
# container needs no index), and rackguard-sim for the fake NVML.
t=$(now)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR/build" "$ROOT" "$ROOT/rackguard-sim" >"$DIR/build/pip.log" 2>&1 ||
  { tail -20 "$DIR/build/pip.log" >&2; die "pip wheel of this checkout failed"; }
AGENT=$(ls "$DIR"/build/rackguard-[0-9]*.whl)
SIM=$(ls "$DIR"/build/rackguard_sim-*.whl)
PINS=$(cat "$ROOT/constraints.txt" "$ROOT/pyproject.toml" | sha256sum | cut -c1-12)
WHEELHOUSE=$CACHE/systemd-wheels-$PINS
if [ ! -d "$WHEELHOUSE" ]; then
  rm -rf "$WHEELHOUSE.tmp"
  "$PY" -m pip wheel -q -c "$ROOT/constraints.txt" -w "$WHEELHOUSE.tmp" "$AGENT" >"$DIR/build/pip.log" 2>&1 ||
    { tail -20 "$DIR/build/pip.log" >&2; die "pip wheel of the pinned dependencies failed"; }
  rm -f "$WHEELHOUSE".tmp/rackguard-[0-9]*.whl
  mv "$WHEELHOUSE.tmp" "$WHEELHOUSE"
fi
flock -u 9
cp "$WHEELHOUSE"/*.whl "$DIR/wheels/"
log "wheels ready in $(since "$t")s"

mount -t overlay overlay -o "lowerdir=$IMAGE,upperdir=$DIR/upper,workdir=$DIR/work" "$ROOTFS"
INSTALL=$ROOTFS/root/install
mkdir -p "$INSTALL/wheels"
cp "$AGENT" "$ROOT/constraints.txt" "$INSTALL/"
# The install block of docs/operations.md, as written.
awk '/^## Install on a GPU host/ { sect = 1 } sect && /^```sh$/ { body = 1; next }
     body && /^```$/ { exit } body { print }' "$ROOT/docs/operations.md" >"$DIR/install.sh"
[ -s "$DIR/install.sh" ] || die "no sh block under '## Install on a GPU host' in docs/operations.md"
cp "$DIR/install.sh" "$INSTALL/install.sh"
"$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' >"$DIR/api_port"
(umask 077; "$PY" -c 'import secrets; print(secrets.token_hex(32), end="")' >"$DIR/webhook.key")
# The operator's edit of step 3 ($EDITOR): this node's API port, free on the host.
cat >"$INSTALL/edit-config" <<EDIT
#!/bin/sh
set -e
sed -i 's/^port = 9470\$/port = $(cat "$DIR/api_port")/' "\$1"
grep -q '^port = $(cat "$DIR/api_port")\$' "\$1"
EDIT
chmod 755 "$INSTALL/edit-config"
# The simulated node (see the header): the fakes beside the venv, not in it.
"$PY" -m zipfile -e "$SIM" "$ROOTFS/opt/rackguard-sim"
chmod -R a+rX "$ROOTFS/opt/rackguard-sim"
mkdir -p "$ROOTFS/etc/systemd/system/rackguard.service.d"
cat >"$ROOTFS/etc/systemd/system/rackguard.service.d/50-simulated-node.conf" <<'UNIT'
# Tests only: no GPU here; rackguard's own venv runs the fake NVML (rackguard-sim).
[Service]
ExecStart=
ExecStart=/opt/rackguard/venv/bin/python -m fakes.nvml_module run --config /etc/rackguard/rackguard.toml
Environment=PYTHONPATH=/opt/rackguard-sim RACKGUARD_FAKE_GPUS=2
Environment=RACKGUARD_FAKE_TEMP_FILE=/run/rackguard-sim/temperature
UNIT
echo "$SETTINGS" >"$DIR/settings"
log "overlay ready in $(since "$T0")s"

boot fresh
t=$(now)
# As written; the wheels come from the folder bound in, not from an index.
if ! inct WEBHOOK_KEY="$(cat "$DIR/webhook.key")" EDITOR=/root/install/edit-config \
  PIP_NO_INDEX=1 PIP_FIND_LINKS=/root/install/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 \
  timeout "$TIMEOUT" bash -c 'cd /root/install && exec bash -eux install.sh' >"$DIR/install.log" 2>&1; then
  tail -30 "$DIR/install.log" >&2
  inct journalctl -u rackguard --no-pager -n 30 >&2 || true
  die "the install steps of docs/operations.md failed (trace: $DIR/install.log)"
fi
[ "$(inct systemctl is-active rackguard)" = active ] || die "rackguard is not active after the install"
touch "$DIR/installed"
log "installed as docs/operations.md says in $(since "$t")s; rackguard is active; total $(since "$T0")s"
trap - EXIT
print_env fresh
