#!/usr/bin/env bash
# install-slurm24.sh — a minimal Debian 13 (trixie) userland with Slurm 24.11 in a cache
# directory, for the 24.11 tests (start-slurm24.sh runs its daemons there with chroot).
# Built once; reused while this file is unchanged: the directory's name carries a hash of
# this file, so any change to the recipe below builds a new one (and removes the old ones
# that no running daemon uses). As root; never reads stdin; prints the directory on stdout.
#
# Usage: ROOT=$(scripts/install-slurm24.sh)
#
# Environment (defaults):
#   SLURM24_CACHE=/var/cache/rackguard    SLURM24_MIRROR=http://deb.debian.org/debian
#
# Facts it relies on (tried here): Debian 12's debootstrap knows trixie; trixie ships
# slurm-wlm 24.11; auth_jwt.so is in slurm-wlm-jwt-plugin (without it slurmrestd stops
# with "cannot find auth plugin for auth/jwt"). Package scripts must not start daemons:
# policy-rc.d says no.
set -euo pipefail
exec </dev/null

SUITE=trixie
PKGS="slurmctld slurmd slurmrestd munge slurm-client slurm-wlm-jwt-plugin"
CACHE=${SLURM24_CACHE:-/var/cache/rackguard}
MIRROR=${SLURM24_MIRROR:-http://deb.debian.org/debian}

log() { printf '[install-slurm24] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

SELF=$(cd "$(dirname "$0")" && pwd -P)/$(basename "$0")
HASH=$( { cat "$SELF"; echo "$MIRROR"; } | sha256sum | cut -c1-12)
ROOT=$CACHE/slurm24-$HASH
if [ -e "$ROOT/.complete" ]; then
  echo "$ROOT"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot)"
mkdir -p "$CACHE"
chmod 755 "$CACHE"

# One builder at a time; a second caller waits, then finds the finished tree.
exec 9>"$CACHE/.slurm24.lock"
flock 9
if [ -e "$ROOT/.complete" ]; then
  echo "$ROOT"
  exit 0
fi

in_use() {  # in_use DIR: some process has DIR as its root
  local p
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$1" ] && return 0
  done
  return 1
}
unmount_under() {  # every mount below DIR, deepest first
  local m
  for m in $(awk -v d="$1/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
}

T0=$(date +%s)
if ! command -v debootstrap >/dev/null 2>&1; then
  log "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends debootstrap >&2
fi

BUILD=$ROOT.build
unmount_under "$BUILD"
rm -rf "$BUILD"
trap 'unmount_under "$BUILD"' EXIT
log "debootstrap $SUITE into $BUILD (once; a few minutes)"
debootstrap --variant=minbase "$SUITE" "$BUILD" "$MIRROR" >&2 ||
  die "debootstrap failed (see $BUILD/debootstrap/debootstrap.log)"
cp /etc/resolv.conf "$BUILD/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' > "$BUILD/usr/sbin/policy-rc.d"
chmod 755 "$BUILD/usr/sbin/policy-rc.d"
mount -t proc proc "$BUILD/proc"
log "installing $PKGS"
chroot "$BUILD" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends $PKGS >&2
chroot "$BUILD" apt-get clean
unmount_under "$BUILD"
trap - EXIT
chroot "$BUILD" slurmctld -V >&2
touch "$BUILD/.complete"
mv "$BUILD" "$ROOT"

# Older builds nothing runs in any more.
for old in "$CACHE"/slurm24-*; do
  [ "$old" = "$ROOT" ] || [ ! -d "$old" ] || in_use "$old" && continue
  unmount_under "$old"
  rm -rf "$old"
done
log "built $ROOT in $(( $(date +%s) - T0 )) s ($(du -sh "$ROOT" | cut -f1))"
echo "$ROOT"
