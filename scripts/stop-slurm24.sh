#!/usr/bin/env bash
# stop-slurm24.sh — stop what start-slurm24.sh started, using only the PIDs it recorded in
# DIR/pids/*.pid, each checked against its expected process name and against the tree it
# runs in (`readlink /proc/PID/root`), so that a recycled PID is never signalled. Unmounts
# the tree's /proc once no process runs in the tree any more. Idempotent; never reads stdin.
#
# Usage: scripts/stop-slurm24.sh [DIR]          (default /tmp/rackguard-slurm24)
#        SLURM_CI_PURGE=1 scripts/stop-slurm24.sh DIR   # also delete DIR and its cluster files
set -uo pipefail
exec </dev/null
DIR=${1:-/tmp/rackguard-slurm24}
PIDS=$DIR/pids
log() { printf '[stop-slurm24] %s\n' "$*" >&2; }
ROOT=$(sed -n 's/^ROOT=\([^ ]*\) .*/\1/p' "$DIR/settings" 2>/dev/null)

running() {  # alive and not a zombie
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

stop_one() {  # stop_one NAME EXPECTED_COMM
  local f=$PIDS/$1.pid want=$2 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$want" ] &&
    { [ -z "$ROOT" ] || [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$ROOT" ]; }; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 100); do running "$pid" || break; sleep 0.05; done
    if running "$pid"; then log "$1 ($pid) ignored SIGTERM for 5s; SIGKILL"; kill -KILL "$pid" 2>/dev/null; fi
  fi
  rm -f "$f"
}

in_use() {  # some process still runs inside the tree
  local p
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$1" ] && return 0
  done
  return 1
}

if [ -d "$PIDS" ]; then
  stop_one slurmrestd slurmrestd
  for f in "$PIDS"/slurmd-*.pid; do
    [ -e "$f" ] || continue
    stop_one "$(basename "$f" .pid)" slurmd
  done
  stop_one slurmctld slurmctld
  stop_one munged munged
  rmdir "$PIDS" 2>/dev/null || true
fi
if [ -n "$ROOT" ] && [ -d "$ROOT" ] && mountpoint -q "$ROOT/proc" && ! in_use "$ROOT"; then
  umount "$ROOT/proc" 2>/dev/null || umount -l "$ROOT/proc"
fi
if [ "${SLURM_CI_PURGE:-0}" = 1 ]; then
  cluster=$(readlink "$DIR/cluster" 2>/dev/null)
  case $cluster in */srv/rackguard/*) rm -rf "$cluster" ;; esac
  rm -rf "$DIR"
fi
exit 0
