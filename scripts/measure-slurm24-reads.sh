#!/usr/bin/env bash
# measure-slurm24-reads.sh — what a node read costs a Slurm 24.11 controller holding 10,000
# nodes (the herd measurement of docs/fleet.md, repeated on 24.11): bytes, slurmctld and
# slurmrestd CPU per read, the RPCs slurmctld saw (sdiag), update_time and a hostlist.
# Starts its own cluster (start-slurm24.sh, 4 live nodes + SLURM24_CI_EXTRA_NODES DOWN ones)
# under DIR and stops it at the end. As root; never reads stdin. A report on stdout.
#
# Usage: scripts/measure-slurm24-reads.sh [DIR]    (default /tmp/rackguard-slurm24-measure)
set -euo pipefail
exec </dev/null
SELF=$(cd "$(dirname "$0")" && pwd -P)
DIR=${1:-/tmp/rackguard-slurm24-measure}
export SLURM24_CI_EXTRA_NODES=${SLURM24_CI_EXTRA_NODES:-10000}
export SLURM24_CI_CTLD_PORT=${SLURM24_CI_CTLD_PORT:-6837}
export SLURM24_CI_REST_PORT=${SLURM24_CI_REST_PORT:-6840}
export SLURM24_CI_SLURMD_BASE_PORT=${SLURM24_CI_SLURMD_BASE_PORT:-17201}
mkdir -p "$DIR"; chmod 755 "$DIR"
trap 'SLURM_CI_PURGE=1 "$SELF/stop-slurm24.sh" "$DIR"' EXIT
eval "$("$SELF/start-slurm24.sh" "$DIR")"
in_root() { chroot "$SLURM_CHROOT" env SLURM_CONF="$SLURM_CONF" "$@"; }
TOKEN=$(cat "$SLURM_JWT_FILE")
CTLD=$(cat "$DIR/pids/slurmctld.pid")
REST=$(cat "$DIR/pids/slurmrestd.pid")
HZ=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
get() {  # get PATH: body on stdout
  curl -s -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $TOKEN" "$SLURM_REST_URL$1"
}
# slurmctld's own CPU is not measured per read: its background threads (about a quarter of
# a core here with 10,000 nodes) drown it; sdiag's mean time per RPC is slurmctld's cost.
measure() {  # measure LABEL N COMMAND...: per read: bytes, wall, slurmrestd CPU, slurmctld RPCs
  local label=$1 n=$2 r0 t0 r1 t1 bytes
  shift 2
  bytes=$("$@" | wc -c)
  in_root sdiag --reset >/dev/null
  r0=$(ticks "$REST"); t0=$(date +%s%N)
  for _ in $(seq 1 "$n"); do "$@" >/dev/null; done
  r1=$(ticks "$REST"); t1=$(date +%s%N)
  local rpcs
  rpcs=$(in_root sdiag | awk '/^Remote Procedure Call statistics by message type/{f=1;next} f&&/count:/{gsub(/[()]/,""); sub(/count:/,"",$3); sub(/ave_time:/,"",$4); printf "%s%s ×%s %.1f ms", s, $1, $3, $4/1000; s=", "} /^Remote Procedure Call statistics by user/{exit}')
  printf '| %s | %s B | %.1f ms | %.1f ms | %s |\n' "$label" "$bytes" \
    "$(echo "($t1 - $t0) / 1000000 / $n" | bc -l)" \
    "$(echo "($r1 - $r0) * 1000 / $HZ / $n" | bc -l)" "$rpcs"
}

# A few hundred nodes with a Reason, as a real cluster has.
in_root scontrol update nodename=x[00001-00300] state=down reason="maint ticket" >/dev/null
c0=$(ticks "$CTLD"); sleep 5; IDLE=$(echo "($(ticks "$CTLD") - $c0) * 1000 / $HZ / 5" | bc -l)
echo "Slurm $(in_root scontrol -V | cut -d' ' -f2), $(in_root scontrol -o show nodes | wc -l) nodes, $(nproc) cores"
echo
printf 'slurmctld idle: %.1f ms CPU/s\n\n' "$IDLE"
echo "| read | bytes | wall | slurmrestd CPU | RPCs at slurmctld (count, mean time) |"
echo "|---|---|---|---|---|"
measure 'scontrol -o show nodes' 10 in_root scontrol -o show nodes
measure 'scontrol -o show node x[00001-00040]' 10 in_root scontrol -o show node 'x[00001-00040]'
measure 'squeue --json -w gpu01' 10 in_root squeue --json -w gpu01
measure 'squeue --json' 10 in_root squeue --json
measure "squeue -h -w gpu01 -t RUNNING -o '%i|%j|%u'" 10 in_root squeue -h -w gpu01 -t RUNNING -o '%i|%j|%u'
measure 'GET /slurm/v0.0.42/jobs/' 10 get /slurm/v0.0.42/jobs/
for v in v0.0.40 v0.0.42; do
  measure "GET /slurm/$v/nodes" 3 get "/slurm/$v/nodes"
done
FUTURE=$(( $(date +%s) + 3600 ))
measure "GET …/nodes?update_time=<future>" 20 get "/slurm/v0.0.42/nodes?update_time=$FUTURE"
measure 'GET …/node/x00001' 50 get /slurm/v0.0.42/node/x00001
measure 'GET …/node/x[00001-00040]' 20 get '/slurm/v0.0.42/node/x%5B00001-00040%5D'
BEFORE=$(date +%s)
sleep 1.1
in_root scontrol update nodename=x00500 state=down reason="one change" >/dev/null
measure "GET …/nodes?update_time=<before one change>" 5 get "/slurm/v0.0.42/nodes?update_time=$BEFORE"
echo
status() { curl -s -o /dev/null -w '%{http_code}' -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $TOKEN" "$SLURM_REST_URL$1"; }
count() { get "$1" | python3 -c 'import json,sys; t=sys.stdin.read(); print(len(json.loads(t).get("nodes") or []) if t.strip().startswith("{") else 0)'; }
echo "update_time in the future: HTTP $(status "/slurm/v0.0.42/nodes?update_time=$FUTURE"), $(count "/slurm/v0.0.42/nodes?update_time=$FUTURE") nodes"
echo "update_time before one change: HTTP $(status "/slurm/v0.0.42/nodes?update_time=$BEFORE"), $(count "/slurm/v0.0.42/nodes?update_time=$BEFORE") nodes"
echo "update_time before one change says: $(get "/slurm/v0.0.42/nodes?update_time=$BEFORE" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin).get("errors")))')"
echo "node/x[00001-00040] says: $(get '/slurm/v0.0.42/node/x%5B00001-00040%5D' | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin).get("errors")))')"
echo "node/x[00001-00040]: HTTP $(status '/slurm/v0.0.42/node/x%5B00001-00040%5D'), $(count '/slurm/v0.0.42/node/x%5B00001-00040%5D') nodes"
echo "node/x00001,x00002: HTTP $(status '/slurm/v0.0.42/node/x00001,x00002'), $(count '/slurm/v0.0.42/node/x00001,x00002') nodes"
echo "slurmrestd RSS after: $(awk '/VmRSS/{print $2, $3}' "/proc/$REST/status"), slurmctld RSS: $(awk '/VmRSS/{print $2, $3}' "/proc/$CTLD/status")"
