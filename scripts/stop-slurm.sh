#!/usr/bin/env bash
# stop-slurm.sh — stop what start-slurm.sh started, using only the PIDs it recorded
# in DIR/pids/*.pid, each checked against its expected process name so that a
# recycled PID is never signalled. Idempotent; never reads stdin.
#
# Usage: scripts/stop-slurm.sh [DIR]          (default /tmp/rackguard-slurm)
#        SLURM_CI_PURGE=1 scripts/stop-slurm.sh DIR   # also delete DIR
set -uo pipefail
exec </dev/null
DIR=${1:-/tmp/rackguard-slurm}
PIDS=$DIR/pids
log() { printf '[stop-slurm] %s\n' "$*" >&2; }

running() {  # alive and not a zombie
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

stop_one() {  # stop_one NAME EXPECTED_COMM
  local f=$PIDS/$1.pid want=$2 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$want" ]; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 100); do running "$pid" || break; sleep 0.05; done
    if running "$pid"; then log "$1 ($pid) ignored SIGTERM for 5s; SIGKILL"; kill -KILL "$pid" 2>/dev/null; fi
  fi
  rm -f "$f"
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
if [ "${SLURM_CI_PURGE:-0}" = 1 ]; then rm -rf "$DIR"; fi
exit 0
