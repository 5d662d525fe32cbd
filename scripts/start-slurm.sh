#!/usr/bin/env bash
# start-slurm.sh — a throw-away single-machine Slurm cluster on loopback for the
# tests and the bench: munged, slurmctld, one slurmd per node, slurmrestd with JWT.
# Every file lives under DIR. As root; never reads stdin; idempotent: when the
# daemons recorded in DIR/pids are alive it only re-prints the environment.
#
# Usage:  eval "$(scripts/start-slurm.sh [DIR])"     (DIR default /tmp/rackguard-slurm)
#
# stdout: KEY=VALUE lines (also in DIR/env.sh):
#   SLURM_CONF, SLURM_REST_URL, SLURM_REST_API, SLURM_REST_USER,
#   SLURM_JWT_FILE (a token file, mode 600), SLURM_NODES (e.g. gpu[01-04])
# stderr: progress.
#
# Environment (defaults):
#   SLURM_CI_INSTALL=1 (run install-slurm.sh when something is missing)
#   SLURM_CI_NODES=4  SLURM_CI_NODE_PREFIX=gpu  SLURM_CI_CPUS=1 (CPUs per node: jobs at once)
#   SLURM_CI_CTLD_PORT=6817  SLURM_CI_SLURMD_BASE_PORT=17001  SLURM_CI_REST_PORT=6820
#   SLURM_CI_TOKEN_LIFESPAN=86400  SLURM_CI_TIMEOUT=60
#   SLURM_CI_EXTRA_NODES=0: that many more nodes x[00001-N] that never run a slurmd
#     (State=DOWN, 40 per rack: Features=rack_r001...; SlurmdTimeout=60000 so slurmctld
#     does not ping them), in partition `extra`: a large node table for the
#     controller-load bench (bench/controller_load.py, docs/fleet.md).
#
# Facts it relies on (Slurm 22.05, Debian 12): slurmrestd refuses to run as root,
# so it is started as root with -u nobody; it then reads slurm.conf as nobody, so
# every parent of DIR must be world-traversable. On 22.05 slurmrestd needs the
# openapi/v0.0.3x plugins named (-s), or it asks for slurmdbd. slurmctld and
# slurmd bind 0.0.0.0 (no loopback-only setting); slurmrestd binds 127.0.0.1.
set -euo pipefail
exec </dev/null

SELF=$(cd "$(dirname "$0")" && pwd -P)
DIR=${1:-/tmp/rackguard-slurm}
NNODES=${SLURM_CI_NODES:-4}
PREFIX=${SLURM_CI_NODE_PREFIX:-gpu}
CPUS=${SLURM_CI_CPUS:-1}
CTLD_PORT=${SLURM_CI_CTLD_PORT:-6817}
SLURMD_BASE=${SLURM_CI_SLURMD_BASE_PORT:-17001}
REST_PORT=${SLURM_CI_REST_PORT:-6820}
LIFESPAN=${SLURM_CI_TOKEN_LIFESPAN:-86400}
TIMEOUT=${SLURM_CI_TIMEOUT:-60}
EXTRA=${SLURM_CI_EXTRA_NODES:-0}
REST_USER=root   # SlurmUser=root: the only administrator without slurmdbd
RUSER=nobody

log() { printf '[start-slurm] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (munged, slurmctld and slurmd run as root here)"

if [ "${SLURM_CI_INSTALL:-1}" = 1 ]; then "$SELF/install-slurm.sh"; fi
for b in munged mungekey slurmctld slurmd slurmrestd scontrol sinfo; do
  command -v "$b" >/dev/null 2>&1 || die "$b not installed (run scripts/install-slurm.sh)"
done

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd -P)
chmod 755 "$DIR"
CONF=$DIR/etc/slurm.conf
PIDS=$DIR/pids
NODES="${PREFIX}[01-$(printf '%02d' "$NNODES")]"
[ "$NNODES" = 1 ] && NODES="${PREFIX}01"
export SLURM_CONF=$CONF
SETTINGS="NNODES=$NNODES PREFIX=$PREFIX CTLD=$CTLD_PORT SLURMD=$SLURMD_BASE REST=$REST_PORT EXTRA=$EXTRA"

alive() {  # alive NAME COMM: the recorded PID runs the expected program
  local f=$PIDS/$1.pid pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}
exited() {  # exited NAME: the recorded PID is gone or a zombie (just after `&` it may still
  # be the forked shell, not yet the daemon: `alive` would call that dead)
  local st
  st=$(awk '{print $3}' "/proc/$(cat "$PIDS/$1.pid")/stat" 2>/dev/null) || return 0
  [ -z "$st" ] || [ "$st" = Z ]
}
all_alive() {
  alive munged munged && alive slurmctld slurmctld && alive slurmrestd slurmrestd || return 1
  for i in $(seq 1 "$NNODES"); do alive "slurmd-$(printf '%s%02d' "$PREFIX" "$i")" slurmd || return 1; done
}
print_env() {
  local tok
  tok=$(scontrol token username="$REST_USER" lifespan="$LIFESPAN" | sed 's/^SLURM_JWT=//')
  [ -n "$tok" ] || die "could not mint a JWT"
  (umask 077; printf '%s\n' "$tok" > "$DIR/jwt/token")
  cat > "$DIR/env.sh" <<ENV
SLURM_CONF=$CONF
SLURM_REST_URL=http://127.0.0.1:$REST_PORT
SLURM_REST_API=$(cat "$DIR/rest_api")
SLURM_REST_USER=$REST_USER
SLURM_JWT_FILE=$DIR/jwt/token
SLURM_NODES=$NODES
ENV
  cat "$DIR/env.sh"
}

if [ "$(cat "$DIR/settings" 2>/dev/null)" = "$SETTINGS" ] && all_alive; then
  log "already running under $DIR"
  print_env
  exit 0
fi
[ -d "$PIDS" ] && "$SELF/stop-slurm.sh" "$DIR"
trap 'rc=$?; if [ $rc -ne 0 ]; then log "bring-up failed (rc=$rc); stopping what was started"; "$SELF/stop-slurm.sh" "$DIR"; fi' EXIT

T0=$(date +%s%N)
rm -rf "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/munge-run" "$DIR/env.sh" "$DIR/rest_api" "$DIR/settings"
mkdir -p "$DIR/etc" "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/munge" "$DIR/munge-run" "$DIR/jwt" "$PIDS"
chmod 700 "$DIR/munge" "$DIR/jwt"
chmod 755 "$DIR/munge-run" "$DIR/etc" "$DIR/log"
echo "$SETTINGS" > "$DIR/settings"

# ---- munge
[ -s "$DIR/munge/munge.key" ] || mungekey --create --keyfile="$DIR/munge/munge.key" --bits=1024 >&2
chmod 600 "$DIR/munge/munge.key"
SOCK=$DIR/munge-run/munge.socket
munged -F --force --key-file="$DIR/munge/munge.key" --socket="$SOCK" \
  --pid-file="$DIR/munge-run/munged.pid" --seed-file="$DIR/munge/munged.seed" \
  --log-file="$DIR/log/munged.log" >"$DIR/log/munged.stdout" 2>&1 &
echo $! > "$PIDS/munged.pid"
for _ in $(seq 1 $((TIMEOUT * 10))); do [ -S "$SOCK" ] && break; sleep 0.1; done
munge -S "$SOCK" -n | unmunge -S "$SOCK" >/dev/null || die "munged not working (see $DIR/log/munged.log)"

# ---- slurm.conf
[ -s "$DIR/jwt/jwt_hs256.key" ] || dd if=/dev/urandom of="$DIR/jwt/jwt_hs256.key" bs=32 count=1 status=none
chmod 600 "$DIR/jwt/jwt_hs256.key"
LAST=$((SLURMD_BASE + NNODES - 1))
PORTS="[$SLURMD_BASE-$LAST]"; [ "$NNODES" = 1 ] && PORTS=$SLURMD_BASE
cat > "$CONF" <<CONF
# generated by rackguard scripts/start-slurm.sh
ClusterName=rackguard
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort=$CTLD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$DIR/jwt/jwt_hs256.key
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/state/slurmctld.pid
SlurmdPidFile=$DIR/spool/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
# The configured CPUs count, whatever the machine has (SLURM_CI_CPUS jobs per node).
SlurmdParameters=config_overrides
SlurmdTimeout=$([ "$EXTRA" -gt 0 ] && echo 60000 || echo 300)
SlurmctldTimeout=30
NodeName=$NODES NodeAddr=127.0.0.1 Port=$PORTS CPUs=$CPUS RealMemory=100 State=UNKNOWN
PartitionName=$PREFIX Nodes=$NODES Default=YES MaxTime=INFINITE State=UP
CONF
if [ "$EXTRA" -gt 0 ]; then
  # An unused port: nothing answers there, and slurmctld never asks (SlurmdTimeout).
  for first in $(seq 1 40 "$EXTRA"); do
    last=$((first + 39 > EXTRA ? EXTRA : first + 39))
    printf 'NodeName=x[%05d-%05d] NodeAddr=127.0.0.1 Port=%d CPUs=1 RealMemory=100 State=DOWN Features=rack_r%03d\n' \
      "$first" "$last" $((LAST + 1)) $(((first - 1) / 40 + 1))
  done >> "$CONF"
  printf 'PartitionName=extra Nodes=x[00001-%05d] Default=NO MaxTime=INFINITE State=UP\n' "$EXTRA" >> "$CONF"
fi
chmod 644 "$CONF"
runuser -u "$RUSER" -- test -r "$CONF" || die "$RUSER cannot read $CONF: every parent of $DIR must be world-traversable (o+x)"

# ---- slurmctld
slurmctld -D -i >"$DIR/log/slurmctld.stdout" 2>&1 &
echo $! > "$PIDS/slurmctld.pid"
ok=0
for _ in $(seq 1 $((TIMEOUT * 10))); do
  exited slurmctld && die "slurmctld exited: $(tail -n 5 "$DIR/log/slurmctld.stdout" "$DIR/log/slurmctld.log" 2>/dev/null)"
  scontrol ping 2>/dev/null | grep -q 'is UP' && { ok=1; break; }
  sleep 0.1
done
[ $ok = 1 ] || die "slurmctld not answering after ${TIMEOUT}s"

# ---- one slurmd per node
for i in $(seq 1 "$NNODES"); do
  n=$(printf '%s%02d' "$PREFIX" "$i")
  mkdir -p "$DIR/spool/$n"
  slurmd -D -N "$n" >"$DIR/log/slurmd-$n.stdout" 2>&1 &
  echo $! > "$PIDS/slurmd-$n.pid"
done
ok=0
for _ in $(seq 1 $((TIMEOUT * 10))); do
  [ "$(sinfo -h -N -p "$PREFIX" -o '%t' 2>/dev/null | sort -u | tr '\n' ' ')" = "idle " ] && { ok=1; break; }
  sleep 0.1
done
[ $ok = 1 ] || die "nodes not idle after ${TIMEOUT}s: $(sinfo -N -h -p "$PREFIX" -o '%N:%t' | tr '\n' ' ')"

# ---- slurmrestd (JWT), as nobody
plist=$(runuser -u "$RUSER" -- env SLURM_CONF="$CONF" slurmrestd -s list 2>&1 || true)
if grep -q 'openapi/slurmctld' <<<"$plist"; then
  SPLUG=openapi/slurmctld
  API=$(runuser -u "$RUSER" -- env SLURM_CONF="$CONF" slurmrestd -d list 2>&1 | grep -o 'v0\.0\.[0-9]*' | sort -V | tail -1)
else
  SPLUG=$(grep -o 'openapi/v0\.0\.[0-9]*' <<<"$plist" | sort -uV | paste -sd, -)
  API=$(grep -o 'v0\.0\.[0-9]*' <<<"$SPLUG" | sort -V | tail -1)
fi
[ -n "$SPLUG" ] && [ -n "$API" ] || die "cannot tell slurmrestd's plugins: $plist"
echo "$API" > "$DIR/rest_api"
SLURM_JWT=daemon slurmrestd -u "$RUSER" -g "$(id -gn "$RUSER")" -a rest_auth/jwt -s "$SPLUG" \
  "127.0.0.1:$REST_PORT" >"$DIR/log/slurmrestd.log" 2>&1 &
echo $! > "$PIDS/slurmrestd.pid"
ok=0
for _ in $(seq 1 $((TIMEOUT * 10))); do
  exited slurmrestd && die "slurmrestd exited: $(cat "$DIR/log/slurmrestd.log")"
  # 401 without a token: up, and asking for authentication
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$REST_PORT/slurm/$API/ping" || true)" = 401 ] && { ok=1; break; }
  sleep 0.1
done
[ $ok = 1 ] || die "slurmrestd not answering on 127.0.0.1:$REST_PORT"
log "up in $(( ($(date +%s%N) - T0) / 1000000 )) ms: $NODES, slurmrestd $API on 127.0.0.1:$REST_PORT"
print_env
