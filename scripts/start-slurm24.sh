#!/usr/bin/env bash
# start-slurm24.sh — a throw-away single-machine Slurm 24.11 cluster on loopback for the
# tests: munged, slurmctld, one slurmd per node and slurmrestd (JWT), all run with chroot
# inside the Debian 13 tree install-slurm24.sh builds (Debian 12's 22.05 client tools
# cannot talk to a 24.11 controller, so every Slurm command runs in there too).
# As root; never reads stdin; idempotent: when the daemons recorded in DIR/pids are alive
# it only re-prints the environment. Stop with stop-slurm24.sh DIR.
#
# Usage:  eval "$(scripts/start-slurm24.sh [DIR])"     (DIR default /tmp/rackguard-slurm24)
#
# stdout: KEY=VALUE lines (also in DIR/env.sh), those of start-slurm.sh:
#   SLURM_CONF (a path inside the chroot), SLURM_REST_URL, SLURM_REST_API, SLURM_REST_USER,
#   SLURM_JWT_FILE (a token file on the host, mode 600), SLURM_NODES (e.g. gpu[01-04])
# and SLURM_CHROOT, the tree: a Slurm command is `chroot $SLURM_CHROOT scontrol ...` with
# SLURM_CONF in its environment (chroot keeps the environment).
# stderr: progress.
#
# Environment (defaults; the ports differ from start-slurm.sh's, so both clusters can run):
#   SLURM24_CI_NODES=4  SLURM24_CI_NODE_PREFIX=gpu  SLURM24_CI_CPUS=1
#   SLURM24_CI_CTLD_PORT=6827  SLURM24_CI_SLURMD_BASE_PORT=17101  SLURM24_CI_REST_PORT=6830
#   SLURM24_CI_TOKEN_LIFESPAN=86400  SLURM24_CI_TIMEOUT=60
#   SLURM24_CI_EXTRA_NODES=0: that many more nodes, x00001..., DOWN, with no slurmd
#     (feature rack_rNNN, 40 a rack): a large cluster's node list for measurements
#   and install-slurm24.sh's (SLURM24_CACHE, SLURM24_MIRROR).
#
# The cluster's files live in the tree under /srv/rackguard/<hash of DIR> (the daemons see
# nothing else); DIR on the host holds pids/, env.sh and a link `cluster` to them.
# Facts it relies on (Slurm 24.11.5, tried here): the tree needs /proc mounted and an
# /etc/hosts naming this host (else slurmctld will not start as primary);
# SlurmctldHost=<hostname>(127.0.0.1); slurmrestd needs `-s openapi/slurmctld` (without
# it: "Failure loading plugin path bindings") and refuses to run as root (-u nobody).
set -euo pipefail
exec </dev/null

SELF=$(cd "$(dirname "$0")" && pwd -P)
DIR=${1:-/tmp/rackguard-slurm24}
NNODES=${SLURM24_CI_NODES:-4}
PREFIX=${SLURM24_CI_NODE_PREFIX:-gpu}
CPUS=${SLURM24_CI_CPUS:-1}
CTLD_PORT=${SLURM24_CI_CTLD_PORT:-6827}
SLURMD_BASE=${SLURM24_CI_SLURMD_BASE_PORT:-17101}
REST_PORT=${SLURM24_CI_REST_PORT:-6830}
LIFESPAN=${SLURM24_CI_TOKEN_LIFESPAN:-86400}
TIMEOUT=${SLURM24_CI_TIMEOUT:-60}
EXTRA=${SLURM24_CI_EXTRA_NODES:-0}
REST_USER=root   # SlurmUser=root: the only administrator without slurmdbd
RUSER=nobody

log() { printf '[start-slurm24] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (chroot, munged, slurmctld and slurmd run as root here)"

T0=$(date +%s%N)
ROOT=$("$SELF/install-slurm24.sh")
ROOT=$(cd "$ROOT" && pwd -P)
[ -x "$ROOT/usr/sbin/slurmctld" ] || die "no slurmctld in $ROOT"

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd -P)
chmod 755 "$DIR"
TAG=$(printf '%s' "$DIR" | sha256sum | cut -c1-12)
C=/srv/rackguard/$TAG          # the cluster's directory, as the daemons see it
HC=$ROOT$C                     # ... and on the host
CONF=$C/etc/slurm.conf
PIDS=$DIR/pids
NODES="${PREFIX}[01-$(printf '%02d' "$NNODES")]"
[ "$NNODES" = 1 ] && NODES="${PREFIX}01"
HOST=$(hostname)
SETTINGS="ROOT=$ROOT NNODES=$NNODES PREFIX=$PREFIX CTLD=$CTLD_PORT SLURMD=$SLURMD_BASE REST=$REST_PORT EXTRA=$EXTRA"

in_root() { chroot "$ROOT" env SLURM_CONF="$CONF" "$@"; }
alive() {  # alive NAME COMM: the recorded PID runs the expected program inside the tree
  local f=$PIDS/$1.pid pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$ROOT" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}
exited() {  # exited NAME: the recorded PID is gone or a zombie (while starting, it may
  # still be chroot, not yet the daemon: `alive` would be wrong there)
  local pid st
  pid=$(cat "$PIDS/$1.pid")
  st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 0
  [ -z "$st" ] || [ "$st" = Z ]
}
all_alive() {
  alive munged munged && alive slurmctld slurmctld && alive slurmrestd slurmrestd || return 1
  for i in $(seq 1 "$NNODES"); do alive "slurmd-$(printf '%s%02d' "$PREFIX" "$i")" slurmd || return 1; done
}
print_env() {
  local tok
  tok=$(in_root scontrol token username="$REST_USER" lifespan="$LIFESPAN" | sed 's/^SLURM_JWT=//')
  [ -n "$tok" ] || die "could not mint a JWT"
  (umask 077; printf '%s\n' "$tok" > "$HC/jwt/token")
  cat > "$DIR/env.sh" <<ENV
SLURM_CONF=$CONF
SLURM_REST_URL=http://127.0.0.1:$REST_PORT
SLURM_REST_API=$(cat "$DIR/rest_api")
SLURM_REST_USER=$REST_USER
SLURM_JWT_FILE=$HC/jwt/token
SLURM_NODES=$NODES
SLURM_CHROOT=$ROOT
ENV
  cat "$DIR/env.sh"
}

if [ "$(cat "$DIR/settings" 2>/dev/null)" = "$SETTINGS" ] && all_alive; then
  log "already running under $DIR"
  print_env
  exit 0
fi
[ -d "$PIDS" ] && "$SELF/stop-slurm24.sh" "$DIR"
trap 'rc=$?; if [ $rc -ne 0 ]; then log "bring-up failed (rc=$rc); stopping what was started"; "$SELF/stop-slurm24.sh" "$DIR"; fi' EXIT

# ---- the tree: /proc, and a hosts file that names this machine
mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
printf '127.0.0.1\tlocalhost %s\n::1\tlocalhost ip6-localhost\n' "$HOST" > "$ROOT/etc/hosts.rg.$$"
mv "$ROOT/etc/hosts.rg.$$" "$ROOT/etc/hosts"
chmod 755 "$ROOT/srv"
mkdir -p "$ROOT/srv/rackguard"
chmod 755 "$ROOT/srv/rackguard"

rm -rf "$HC/state" "$HC/spool" "$HC/log" "$HC/munge-run" "$DIR/env.sh" "$DIR/rest_api" "$DIR/settings"
mkdir -p "$HC/etc" "$HC/state" "$HC/spool" "$HC/log" "$HC/munge" "$HC/munge-run" "$HC/jwt" "$HC/jobs" "$PIDS"
chmod 755 "$HC" "$HC/munge-run" "$HC/etc" "$HC/log" "$HC/jobs"
chmod 700 "$HC/munge" "$HC/jwt"
ln -sfn "$HC" "$DIR/cluster"
echo "$SETTINGS" > "$DIR/settings"

# ---- munge
[ -s "$HC/munge/munge.key" ] || in_root mungekey --create --keyfile="$C/munge/munge.key" --bits=1024 >&2
chmod 600 "$HC/munge/munge.key"
SOCK=$C/munge-run/munge.socket
chroot "$ROOT" munged -F --force --key-file="$C/munge/munge.key" --socket="$SOCK" \
  --pid-file="$C/munge-run/munged.pid" --seed-file="$C/munge/munged.seed" \
  --log-file="$C/log/munged.log" >"$HC/log/munged.stdout" 2>&1 &
echo $! > "$PIDS/munged.pid"
for _ in $(seq 1 $((TIMEOUT * 10))); do [ -S "$ROOT$SOCK" ] && break; sleep 0.1; done
in_root sh -c "munge -S '$SOCK' -n | unmunge -S '$SOCK' >/dev/null" ||
  die "munged not working (see $HC/log/munged.log)"

# ---- slurm.conf
[ -s "$HC/jwt/jwt_hs256.key" ] || dd if=/dev/urandom of="$HC/jwt/jwt_hs256.key" bs=32 count=1 status=none
chmod 600 "$HC/jwt/jwt_hs256.key"
LAST=$((SLURMD_BASE + NNODES - 1))
PORTS="[$SLURMD_BASE-$LAST]"; [ "$NNODES" = 1 ] && PORTS=$SLURMD_BASE
cat > "$HC/etc/slurm.conf" <<CONF
# generated by rackguard scripts/start-slurm24.sh
ClusterName=rackguard24
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmctldPort=$CTLD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$C/jwt/jwt_hs256.key
StateSaveLocation=$C/state
SlurmdSpoolDir=$C/spool/%n
SlurmctldPidFile=$C/state/slurmctld.pid
SlurmdPidFile=$C/spool/slurmd-%n.pid
SlurmctldLogFile=$C/log/slurmctld.log
SlurmdLogFile=$C/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
# Cores only: a job without --mem would take the node's whole memory (one job per node).
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Only the backfill scheduler starts heterogeneous jobs: every second, not every 30.
SchedulerParameters=bf_interval=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=$([ "$EXTRA" = 0 ] && echo 300 || echo 60000)
SlurmctldTimeout=30
NodeName=$NODES NodeAddr=127.0.0.1 Port=$PORTS CPUs=$CPUS RealMemory=100 State=UNKNOWN
PartitionName=$PREFIX Nodes=$NODES Default=YES MaxTime=INFINITE State=UP
CONF
# A long SlurmdTimeout with extra nodes: slurmctld would otherwise ping every dead one.
for i in $(seq 1 "$EXTRA"); do
  printf 'NodeName=x%05d NodeAddr=127.0.0.1 Port=%d State=DOWN Features=rack_r%03d\n' \
    "$i" $((LAST + 1)) $(( (i - 1) / 40 ))
done >> "$HC/etc/slurm.conf"
# No cgroup tree inside the chroot: slurmd 24.11 stops with "cgroup filesystem not mounted"
# unless the cgroup plugin is disabled (task/none and proctrack/linuxproc do not need it).
echo "CgroupPlugin=disabled" > "$HC/etc/cgroup.conf"
chmod 644 "$HC/etc/slurm.conf" "$HC/etc/cgroup.conf"
chroot --userspec="$RUSER:nogroup" "$ROOT" test -r "$CONF" ||
  die "$RUSER cannot read $CONF inside $ROOT: every parent must be world-traversable"

# ---- slurmctld
SLURM_CONF=$CONF chroot "$ROOT" slurmctld -D -i >"$HC/log/slurmctld.stdout" 2>&1 &
echo $! > "$PIDS/slurmctld.pid"
ok=0
for _ in $(seq 1 $((TIMEOUT * 10))); do
  exited slurmctld && die "slurmctld exited: $(tail -n 5 "$HC/log/slurmctld.stdout" "$HC/log/slurmctld.log" 2>/dev/null)"
  in_root scontrol ping 2>/dev/null | grep -q 'is UP' && { ok=1; break; }
  sleep 0.1
done
[ $ok = 1 ] || die "slurmctld not answering after ${TIMEOUT}s"

# ---- one slurmd per node
for i in $(seq 1 "$NNODES"); do
  n=$(printf '%s%02d' "$PREFIX" "$i")
  mkdir -p "$HC/spool/$n"
  SLURM_CONF=$CONF chroot "$ROOT" slurmd -D -N "$n" >"$HC/log/slurmd-$n.stdout" 2>&1 &
  echo $! > "$PIDS/slurmd-$n.pid"
done
ok=0
for _ in $(seq 1 $((TIMEOUT * 10))); do
  for i in $(seq 1 "$NNODES"); do
    n=$(printf '%s%02d' "$PREFIX" "$i")
    exited "slurmd-$n" && die "slurmd $n exited: $(tail -n 5 "$HC/log/slurmd-$n.stdout")"
  done
  [ "$(in_root sinfo -h -N -o '%t' 2>/dev/null | sort -u | tr '\n' ' ')" = "idle " ] && { ok=1; break; }
  sleep 0.1
done
[ $ok = 1 ] || die "nodes not idle after ${TIMEOUT}s: $(in_root sinfo -N -h -o '%N:%t' | tr '\n' ' ')"

# ---- slurmrestd (JWT), as nobody
parsers=$(SLURM_CONF=$CONF chroot --userspec="$RUSER:nogroup" "$ROOT" slurmrestd -d list 2>&1 || true)
API=$(grep -o 'v0\.0\.[0-9]*' <<<"$parsers" | sort -V | tail -1)
[ -n "$API" ] || die "cannot tell slurmrestd's data parsers: $parsers"
echo "$API" > "$DIR/rest_api"
SLURM_CONF=$CONF SLURM_JWT=daemon chroot "$ROOT" slurmrestd -u "$RUSER" -g nogroup \
  -a rest_auth/jwt -s openapi/slurmctld "127.0.0.1:$REST_PORT" >"$HC/log/slurmrestd.log" 2>&1 &
echo $! > "$PIDS/slurmrestd.pid"
ok=0
for _ in $(seq 1 $((TIMEOUT * 10))); do
  exited slurmrestd && die "slurmrestd exited: $(cat "$HC/log/slurmrestd.log")"
  # 401 without a token: up, and asking for authentication
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$REST_PORT/slurm/$API/ping" || true)" = 401 ] && { ok=1; break; }
  sleep 0.1
done
[ $ok = 1 ] || die "slurmrestd not answering on 127.0.0.1:$REST_PORT"
log "up in $(( ($(date +%s%N) - T0) / 1000000 )) ms: $NODES, Slurm $(in_root scontrol -V | cut -d' ' -f2), slurmrestd $API on 127.0.0.1:$REST_PORT, tree $ROOT"
print_env
