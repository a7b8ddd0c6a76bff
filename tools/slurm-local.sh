#!/usr/bin/env bash
# A private one-node Slurm cluster on this machine, for testing `chiar slurm`
# (tests/slurm/slurm_test.sh) without a real cluster. TEST CLUSTER ONLY: it
# runs every daemon as root, with no accounting, no cgroups and a private
# munge key, which is fine in a throwaway container and wrong anywhere else.
#
# Usage (as root; Debian packages slurm-wlm and munge, see tools/install-deps.sh):
#   tools/slurm-local.sh start    # start munged, slurmctld, slurmd; wait until the node is idle
#   tools/slurm-local.sh status   # say which of them run
#   tools/slurm-local.sh stop     # cancel our jobs, stop exactly the daemons `start` started
# then, in the shell that submits jobs:
#   export SLURM_CONF=/tmp/chiar-slurm/slurm.conf   (printed by `start`)
#
# Everything lives in one folder, ${CHIAR_SLURM_DIR:-/tmp/chiar-slurm}: the
# configuration, the munge key and socket, Slurm's state and spool, logs and
# pid files. Nothing under /etc is read or written: the daemons and the
# clients find our slurm.conf through SLURM_CONF and `-f`, and munge runs on
# its own socket with its own key, so a site munge stays untouched. It will
# not start next to a Slurm it did not start (foreign slurmctld/slurmd
# running, or a site /etc/slurm/slurm.conf): that one is somebody's cluster.
#
# Exit status: 0 done; 1 a daemon failed to start or stop (log tails are
# printed); 2 bad usage; 3 the environment does not allow it (not root,
# binaries missing, a foreign Slurm present).
set -euo pipefail

dir=${CHIAR_SLURM_DIR:-/tmp/chiar-slurm}
conf=$dir/slurm.conf
munge_dir=$dir/munge
munge_socket=$munge_dir/munge.socket.2
ctld_pidfile=$dir/slurmctld.pid
slurmd_pidfile=$dir/slurmd.pid
munged_pidfile=$munge_dir/munged.pid
# Not Slurm's default ports (6817/6818), so a site Slurm started later on this
# host does not collide with ours.
ctld_port=${CHIAR_SLURM_CTLD_PORT:-16817}
slurmd_port=${CHIAR_SLURM_SLURMD_PORT:-16818}
node=$(hostname -s)
start_timeout=${CHIAR_SLURM_START_TIMEOUT:-60}

say() { echo "slurm-local: $*"; }
die() { local code=$1; shift; echo "slurm-local: $*" >&2; exit "$code"; }

# Pid from a pid file when that process runs and is ours: its command line
# names our folder (slurmctld/slurmd get -f $conf, munged gets --socket
# inside $dir). Guards against a stale pid file whose pid was reused.
our_pid() {
  local pidfile=$1 pid
  [ -s "$pidfile" ] || return 1
  pid=$(tr -dc '0-9' < "$pidfile")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF "$dir/" || return 1
  echo "$pid"
}

running() { our_pid "$1" > /dev/null; }

# Pids of processes named $1 that are not the one in our pid file $2.
foreign_pids() {
  local name=$1 pidfile=$2 ours p out=()
  ours=$(our_pid "$pidfile" || true)
  for p in $(pgrep -x "$name" || true); do
    [ "$p" = "$ours" ] || out+=("$p")
  done
  echo "${out[*]:-}"
}

log_tails() {
  local f
  for f in "$munge_dir/munged.log" "$dir/log/slurmctld.log" "$dir/log/slurmd.log"; do
    [ -f "$f" ] || continue
    echo "---- last lines of $f" >&2
    tail -n 25 "$f" >&2
  done
}

check_environment() {
  [ "$(id -u)" -eq 0 ] || die 3 "must run as root (the test cluster runs its daemons as root)"
  local b
  for b in munged mungekey slurmctld slurmd sinfo scontrol squeue scancel; do
    command -v "$b" > /dev/null ||
      die 3 "$b not found on PATH: install the Debian packages slurm-wlm and munge (tools/install-deps.sh)"
  done
}

refuse_foreign_slurm() {
  local f
  f=$(foreign_pids slurmctld "$ctld_pidfile")
  [ -z "$f" ] || die 3 "a slurmctld this script did not start is running (pid $f); refusing to start a second cluster next to it"
  f=$(foreign_pids slurmd "$slurmd_pidfile")
  [ -z "$f" ] || die 3 "a slurmd this script did not start is running (pid $f); refusing to start a second cluster next to it"
  if [ -e /etc/slurm/slurm.conf ] || [ -e /etc/slurm-llnl/slurm.conf ]; then
    die 3 "a site Slurm is configured (/etc/slurm/slurm.conf); refusing to start a test cluster next to it"
  fi
}

# The node's CPU topology as slurmd sees it, so that the configuration
# matches the hardware (a mismatch drains the node); nproc if that fails.
node_hardware() {
  local line
  line=$(slurmd -C 2>/dev/null | head -n 1 || true)
  if [[ $line == NodeName=* ]]; then
    # Drop the node name (ours is set below) and RealMemory (a modest value
    # below suits a test; more than the machine has would drain the node).
    echo "$line" | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | tr '\n' ' '
  else
    echo "CPUs=$(nproc)"
  fi
}

write_conf() {
  local hw
  hw=$(node_hardware)
  cat > "$conf" <<EOF
# Written by tools/slurm-local.sh: a one-node TEST cluster, not for real use.
ClusterName=chiar-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$ctld_pidfile
SlurmdPidFile=$slurmd_pidfile
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/plugstack.conf
# Containers have no usable cgroups: track processes by parentage, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
# Cores, not whole nodes: several 1-CPU array tasks share the node.
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# Time between SIGTERM and SIGKILL on scancel: chiar saves a checkpoint then.
KillWait=30
MinJobAge=30
NodeName=$node NodeAddr=127.0.0.1 $hw RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  # Our own (empty) SPANK stack: the Debian one under /etc is not ours to load.
  : > "$dir/plugstack.conf"
}

start_munged() {
  mkdir -p "$munge_dir"
  chmod 700 "$munge_dir"
  if [ ! -s "$munge_dir/munge.key" ]; then
    mungekey --create --keyfile="$munge_dir/munge.key"
    chmod 600 "$munge_dir/munge.key"
  fi
  munged --socket="$munge_socket" --key-file="$munge_dir/munge.key" \
         --pid-file="$munged_pidfile" --log-file="$munge_dir/munged.log" \
         --seed-file="$munge_dir/munged.seed" --force
}

wait_for_pidfile() {
  local pidfile=$1 what=$2
  for _ in $(seq 1 50); do
    running "$pidfile" && return 0
    sleep 0.2
  done
  log_tails
  die 1 "$what did not start (no live pid in $pidfile)"
}

do_start() {
  check_environment
  if running "$ctld_pidfile" && running "$slurmd_pidfile" && running "$munged_pidfile"; then
    say "already running (slurmctld, slurmd, munged from $dir)"
    say "export SLURM_CONF=$conf"
    return 0
  fi
  refuse_foreign_slurm
  # A half-running cluster (a daemon died): start over from nothing.
  if running "$ctld_pidfile" || running "$slurmd_pidfile" || running "$munged_pidfile"; then
    say "some daemons of ours run, others not: restarting them all"
    do_stop
  fi

  mkdir -p "$dir"
  chmod 700 "$dir"
  # Fresh state each start: no jobs or node states left from an earlier run.
  rm -rf "$dir/state" "$dir/spool" "$dir/log"
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  write_conf
  export SLURM_CONF=$conf

  start_munged
  wait_for_pidfile "$munged_pidfile" munged
  # -i: ignore state files, -c: clear the job queue; -f: our configuration.
  slurmctld -f "$conf" -c -i
  wait_for_pidfile "$ctld_pidfile" slurmctld
  slurmd -f "$conf" -N "$node"
  wait_for_pidfile "$slurmd_pidfile" slurmd

  local waited=0 state=""
  while :; do
    state=$(sinfo -h -n "$node" -o %T 2>/dev/null | head -n 1 || true)
    [ "$state" = idle ] && break
    if [ "$waited" -ge "$start_timeout" ]; then
      sinfo -N -l >&2 2>&1 || true
      log_tails
      die 1 "node $node not idle after ${start_timeout}s (state: ${state:-none})"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  say "node $node idle; daemons from $dir (slurmctld port $ctld_port, slurmd port $slurmd_port)"
  say "export SLURM_CONF=$conf"
}

stop_pid() {
  local pidfile=$1 what=$2 pid
  pid=$(our_pid "$pidfile") || { rm -f "$pidfile"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
    sleep 0.2
  done
  say "$what (pid $pid) ignored SIGTERM for 20 s: killing it"
  kill -KILL "$pid" 2>/dev/null || true
  sleep 0.5
  rm -f "$pidfile"
}

# Job steps run under slurmstepd, which outlives slurmd. Ours inherited
# SLURM_CONF=$conf from slurmd, which tells them from any other.
our_stepds() {
  local p
  for p in $(pgrep -x slurmstepd || true); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$conf" && echo "$p"
  done
  return 0
}

# Every process below pid $1, deepest last.
descendants() {
  local c
  for c in $(pgrep -P "$1" || true); do
    echo "$c"
    descendants "$c"
  done
}

do_stop() {
  [ "$(id -u)" -eq 0 ] || die 3 "must run as root"
  export SLURM_CONF=$conf
  if running "$ctld_pidfile"; then
    # Cancel our jobs first and let them end, so that no step is orphaned.
    local jobs
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      say "cancelling jobs: $(echo "$jobs" | tr '\n' ' ')"
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      for _ in $(seq 1 45); do
        [ -z "$(squeue -h -o %A 2>/dev/null || true)" ] && break
        sleep 1
      done
    fi
  fi
  stop_pid "$slurmd_pidfile" slurmd
  stop_pid "$ctld_pidfile" slurmctld
  local p left
  # Steps whose jobs could not be cancelled (slurmctld was down): their
  # processes first, then the step daemons.
  left=$(our_stepds)
  if [ -n "$left" ]; then
    say "killing leftover job steps: $(echo "$left" | tr '\n' ' ')"
    for p in $left; do
      # shellcheck disable=SC2046
      kill -KILL $(descendants "$p") 2>/dev/null || true
      kill -KILL "$p" 2>/dev/null || true
    done
    sleep 0.5
  fi
  stop_pid "$munged_pidfile" munged
  left=""
  for f in "$slurmd_pidfile" "$ctld_pidfile" "$munged_pidfile"; do
    running "$f" && left="$left $(our_pid "$f")"
  done
  left="$left $(our_stepds | tr '\n' ' ')"
  if [ -n "${left// /}" ]; then
    die 1 "still running after stop:$left"
  fi
  say "stopped"
}

do_status() {
  local rc=0 f name pid
  for f in "$munged_pidfile:munged" "$ctld_pidfile:slurmctld" "$slurmd_pidfile:slurmd"; do
    name=${f##*:}
    if pid=$(our_pid "${f%:*}"); then
      say "$name running (pid $pid)"
    else
      say "$name not running"
      rc=1
    fi
  done
  if [ "$rc" -eq 0 ]; then
    SLURM_CONF=$conf sinfo -h -o "slurm-local: partition %P node %N %T" 2>/dev/null || true
    say "export SLURM_CONF=$conf"
  fi
  return "$rc"
}

case "${1:-}" in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
