#!/usr/bin/env bash
# stop-systemd-container.sh — power off what start-systemd-container.sh booted in
# DIR: SIGTERM to the recorded systemd-nspawn (checked by name, so a recycled PID is
# never signalled), which shuts the container's systemd down cleanly; SIGKILL after
# 60 s. Then unmounts DIR/root. DIR keeps the container's state, so a later start
# boots it again (a reboot). Idempotent; never reads stdin.
#
# Usage: scripts/stop-systemd-container.sh [DIR]            (default /tmp/rackguard-systemd)
#        SYSTEMD_CT_PURGE=1 scripts/stop-systemd-container.sh DIR   # also delete DIR
set -uo pipefail
exec </dev/null
DIR=${1:-/tmp/rackguard-systemd}
log() { printf '[stop-systemd-container] %s\n' "$*" >&2; }
running() {  # alive and not a zombie
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

if [ -s "$DIR/nspawn.pid" ]; then
  pid=$(cat "$DIR/nspawn.pid")
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = systemd-nspawn ]; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 600); do running "$pid" || break; sleep 0.1; done
    if running "$pid"; then
      log "systemd-nspawn ($pid) still runs 60s after SIGTERM; SIGKILL"
      kill -KILL "$pid" 2>/dev/null
      for _ in $(seq 1 100); do running "$pid" || break; sleep 0.1; done
    fi
  fi
  rm -f "$DIR/nspawn.pid"
fi
if mountpoint -q "$DIR/root" 2>/dev/null; then
  umount "$DIR/root" || { log "cannot unmount $DIR/root"; exit 1; }
fi
if [ "${SYSTEMD_CT_PURGE:-0}" = 1 ] && [ -d "$DIR" ]; then
  mountpoint -q "$DIR/root" 2>/dev/null && { log "$DIR/root still mounted; not deleting"; exit 1; }
  rm -rf "$DIR"
fi
exit 0
