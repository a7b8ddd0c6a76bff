#!/usr/bin/env bash
# End-to-end test of `chiar slurm` on a real one-node Slurm (tools/slurm-local.sh):
#   A. a 6-run matrix as a job array of 3 tasks; the shard stores merged with
#      `chiar merge` (twice: the second changes nothing) and listed by `chiar show`;
#   B. a one-run job cancelled mid-run (chiar records the run 'interrupted'),
#      then the same sbatch script resubmitted: the run resumes and finishes;
#   C. one run over two processes started by `srun --ntasks 2` (Slurm's
#      variables make the c10d world): the same losses as one process.
#
# Usage: bash tests/slurm/slurm_test.sh CHIAR_BINARY SOURCE_DIR
# (the ctest entry `slurm` runs it). Needs root and the Debian packages
# slurm-wlm and munge; without them it prints "SKIPPED [slurm]: <reason>" and
# exits 77. It starts the local cluster if it is not running, and stops it at
# the end only if it started it. Prints one PASS/FAIL line per check; exit 1
# on the first failure, with the relevant logs. Environment:
#   CHIAR_SLURM_DIR       the cluster's folder (default /tmp/chiar-slurm)
#   CHIAR_SLURM_KEEP=1    keep the temporary folder even on success
set -euo pipefail

skip() { echo "SKIPPED [slurm]: $*"; exit 77; }

[ $# -ge 2 ] || { echo "usage: $0 CHIAR_BINARY SOURCE_DIR" >&2; exit 2; }
chiar=$(readlink -f "$1")
src=$(readlink -f "$2")
here=$src/tests/slurm
slurm_local=$src/tools/slurm-local.sh
[ -x "$chiar" ] || { echo "FAIL: $chiar: not an executable chiar binary" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root to run the local Slurm daemons (tools/slurm-local.sh)"
for b in munged mungekey slurmctld slurmd sbatch squeue scancel sinfo scontrol; do
  command -v "$b" > /dev/null || skip "$b not found: install slurm-wlm and munge (tools/install-deps.sh)"
done
command -v sqlite3 > /dev/null || { echo "FAIL: sqlite3 (the CLI) not found: tools/install-deps.sh installs it" >&2; exit 1; }

export CHIAR_SLURM_DIR=${CHIAR_SLURM_DIR:-/tmp/chiar-slurm}
export SLURM_CONF=$CHIAR_SLURM_DIR/slurm.conf

started=0
tmp=""
jobs=()
ok=0
test_start=$(date +%s)

cleanup() {
  local rc=$?
  # Our jobs end with the test, whatever happened to it.
  if [ ${#jobs[@]} -gt 0 ]; then scancel "${jobs[@]}" 2> /dev/null || true; fi
  if [ "$started" -eq 1 ]; then
    bash "$slurm_local" stop || echo "slurm_test: tools/slurm-local.sh stop failed" >&2
  fi
  if [ -n "$tmp" ]; then
    if [ "$ok" -eq 1 ] && [ "${CHIAR_SLURM_KEEP:-0}" != 1 ]; then
      rm -rf "$tmp"
    else
      echo "slurm_test: kept $tmp"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# A command that fails outside the checks below still gets a FAIL line.
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND (exit $?)"' ERR

pass() { echo "PASS: $*"; }

# FAIL line, then the tails of the files named after "--", then exit 1.
fail() {
  local message=() pattern f
  while [ $# -gt 0 ] && [ "$1" != -- ]; do message+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  echo "FAIL: ${message[*]}"
  for pattern in "$@"; do
    for f in $pattern; do  # globs, expanded here
      [ -f "$f" ] || continue
      echo "---- last lines of $f"
      tail -n 30 "$f"
    done
  done
  exit 1
}

# One value from a store; a store being written may be busy for a moment.
q() { sqlite3 -batch -noheader -cmd ".timeout 5000" "$1" "$2"; }

# Start the cluster unless it runs already.
if bash "$slurm_local" status > /dev/null 2>&1; then
  echo "slurm_test: using the running local Slurm in $CHIAR_SLURM_DIR"
else
  rc=0
  out=$(bash "$slurm_local" start 2>&1) || rc=$?
  echo "$out"
  case $rc in
    0) started=1 ;;
    3) skip "tools/slurm-local.sh start refused: $(echo "$out" | tail -n 1)" ;;
    *) started=1; fail "tools/slurm-local.sh start (exit $rc)" ;;
  esac
fi
pass "local Slurm up: $(sinfo -h -o '%P %N %T' | head -n 1)"

tmp=$(mktemp -d /tmp/chiar-slurm-test.XXXXXX)
cd "$tmp"  # the jobs' working folder (chiar slurm records it): caches land here

# Waits until job $1 has left the queue or every task of it has ended;
# $2 seconds at most. Leaves each task's final state in $tmp/$1.states.
wait_job() {
  local id=$1 limit=$2 waited=0 out
  while :; do
    if out=$(squeue -h -t all -j "$id" -o '%i %T' 2> "$tmp/squeue.err"); then
      [ -n "$out" ] && echo "$out" > "$tmp/$id.states"
      if [ -z "$out" ] || ! echo "$out" | grep -qE ' (PENDING|CONFIGURING|RUNNING|COMPLETING|REQUEUED|RESIZING|SUSPENDED|SIGNALING|STAGE_OUT|STOPPED|REQUEUE_HOLD|REQUEUE_FED|RESV_DEL_HOLD|SPECIAL_EXIT)$'; then
        return 0
      fi
    elif grep -q "Invalid job id" "$tmp/squeue.err"; then
      return 0  # ended, and already purged from the controller
    fi
    if [ "$waited" -ge "$limit" ]; then
      squeue -t all -j "$id" || true
      return 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
}

# chiar slurm ... --submit; sets job_id from its line "submitted job <ID>: ...".
submit() {
  local log=$1
  shift
  "$chiar" slurm "$@" --submit > "$log" 2>&1 || fail "chiar slurm $* (exit $?)" -- "$log"
  job_id=$(sed -n 's/^submitted job \([0-9][0-9]*\).*/\1/p' "$log" | head -n 1)
  [ -n "$job_id" ] || fail "chiar slurm printed no 'submitted job <ID>' line" -- "$log"
  jobs+=("$job_id")
}

# ---------------------------------------------------------------- case A
echo "== case A: 6 runs as a job array of 3 tasks"
cp "$here/tiny.toml" "$tmp/m.toml"
out=$tmp/out
submit "$tmp/slurm_a.txt" "$tmp/m.toml" --tasks 3 --dir "$out"
job_a=$job_id
pass "chiar slurm --submit: job $job_a ($(head -n 1 "$tmp/slurm_a.txt"))"
[ -f "$out/slurm.sbatch" ] || fail "$out/slurm.sbatch not written"
t0=$(date +%s)
wait_job "$job_a" 300 || fail "job $job_a still queued after 300 s" -- "$out/logs/*.out" "$CHIAR_SLURM_DIR/log/slurmctld.log"
pass "job $job_a ended after $(( $(date +%s) - t0 )) s"
if [ -f "$tmp/$job_a.states" ] && grep -vq ' COMPLETED$' "$tmp/$job_a.states"; then
  fail "job $job_a: not every array task COMPLETED: $(tr '\n' ' ' < "$tmp/$job_a.states")" -- "$out/logs/*.out"
fi
pass "every array task COMPLETED: $(tr '\n' ' ' < "$tmp/$job_a.states" 2> /dev/null || echo '(purged)')"
for i in 1 2 3; do
  [ -f "$out/shard-$i.db" ] || fail "$out/shard-$i.db missing" -- "$out/logs/${job_a}_$i.out"
done
pass "shard-1.db .. shard-3.db exist ($(for i in 1 2 3; do printf '%s ' "$(q "$out/shard-$i.db" 'SELECT COUNT(*) FROM runs')"; done)runs)"
for i in 1 2 3; do
  grep -q ': starting (' "$out/logs/${job_a}_$i.out" || fail "task $i's log has no 'starting' line" -- "$out/logs/${job_a}_$i.out"
done
pass "each task's log logs/${job_a}_<i>.out shows its runs starting"

"$chiar" merge "$tmp/all.db" "$out" > "$tmp/merge1.txt" 2>&1 || fail "chiar merge $tmp/all.db $out (exit $?)" -- "$tmp/merge1.txt"
pass "chiar merge: $(tail -n 1 "$tmp/merge1.txt")"
n=$(q "$tmp/all.db" "SELECT COUNT(*) FROM runs")
[ "$n" = 6 ] || fail "all.db holds $n runs, expected 6"
pass "all.db holds 6 runs"
n=$(q "$tmp/all.db" "SELECT COUNT(*) FROM runs WHERE status = 'done'")
[ "$n" = 6 ] || fail "all.db: $n of 6 runs done: $(q "$tmp/all.db" "SELECT name || '=' || status FROM runs" | tr '\n' ' ')"
pass "all 6 runs done"
n=$(q "$tmp/all.db" "SELECT COUNT(DISTINCT hash) FROM runs")
[ "$n" = 6 ] || fail "all.db: $n distinct hashes among 6 runs"
pass "6 distinct hashes"
for i in 1 2 3; do q "$out/shard-$i.db" "SELECT name FROM runs"; done | sort > "$tmp/shard_names.txt"
q "$tmp/all.db" "SELECT name FROM runs" | sort > "$tmp/all_names.txt"
if ! cmp -s "$tmp/shard_names.txt" "$tmp/all_names.txt"; then
  echo "runs in the shards / in all.db:"
  diff "$tmp/shard_names.txt" "$tmp/all_names.txt" || true
  fail "each run must be in exactly one shard store"
fi
pass "each run's name occurs in exactly one shard store"

q "$tmp/all.db" .dump > "$tmp/dump1.sql"
"$chiar" merge "$tmp/all.db" "$out" > "$tmp/merge2.txt" 2>&1 || fail "second chiar merge (exit $?)" -- "$tmp/merge2.txt"
q "$tmp/all.db" .dump > "$tmp/dump2.sql"
if ! cmp -s "$tmp/dump1.sql" "$tmp/dump2.sql"; then
  diff "$tmp/dump1.sql" "$tmp/dump2.sql" | head -n 20 || true
  fail "the second merge changed all.db"
fi
pass "second chiar merge changes nothing ($(tail -n 1 "$tmp/merge2.txt"))"

"$chiar" show "$out" > "$tmp/show.txt" 2>&1 || fail "chiar show $out (exit $?)" -- "$tmp/show.txt"
missing=""
while read -r name; do
  grep -qF -- "$name" "$tmp/show.txt" || missing="$missing $name"
done < "$tmp/all_names.txt"
[ -z "$missing" ] || fail "chiar show $out does not list:$missing" -- "$tmp/show.txt"
pass "chiar show $out lists all 6 runs"

# ---------------------------------------------------------------- case B
echo "== case B: a run cancelled mid-run, then resumed by resubmitting the script"
cp "$here/long.toml" "$tmp/long.toml"
out2=$tmp/out2
db=$out2/shard-1.db
submit "$tmp/slurm_b.txt" "$tmp/long.toml" --tasks 1 --dir "$out2"
job_b=$job_id
pass "chiar slurm --submit: job $job_b"
log_b=$out2/logs/${job_b}_1.out

# Until the run is running and has a checkpoint to resume from.
waited=0
while :; do
  status=$(q "$db" "SELECT status FROM runs" 2> /dev/null || true)
  ckpts=$(q "$db" "SELECT COUNT(*) FROM checkpoints WHERE kind = 'state'" 2> /dev/null || echo 0)
  [ "$status" = running ] && [ "${ckpts:-0}" -gt 0 ] && break
  [ "$status" = "done" ] && fail "the run finished before it could be cancelled: make tests/slurm/long.toml longer" -- "$log_b"
  [ "$waited" -ge 240 ] && fail "no checkpoint of a running run after 240 s (status '${status}')" -- "$log_b" "$CHIAR_SLURM_DIR/log/slurmd.log"
  sleep 1
  waited=$((waited + 1))
done
pass "run running with a checkpoint after ${waited} s (step $(q "$db" 'SELECT MAX(step) FROM checkpoints'))"

scancel "$job_b"
wait_job "$job_b" 120 || fail "job $job_b still there 120 s after scancel" -- "$log_b"
pass "scancel $job_b: job ended ($(tr '\n' ' ' < "$tmp/$job_b.states" 2> /dev/null || echo purged))"
status=$(q "$db" "SELECT status FROM runs")
[ "$status" = interrupted ] || fail "after scancel the run is '$status', expected 'interrupted'" -- "$log_b"
step_cut=$(q "$db" "SELECT step FROM runs")
first_step=$(q "$db" "SELECT MIN(step) FROM train_log")
rows_cut=$(q "$db" "SELECT COUNT(*) FROM train_log")
[ "${rows_cut:-0}" -gt 0 ] || fail "no train_log rows recorded before the cancel" -- "$log_b"
pass "run recorded 'interrupted' at step $step_cut ($rows_cut train_log rows, first step $first_step)"
grep -q ': starting (' "$log_b" || fail "first task's log has no 'starting' line" -- "$log_b"

sbatch --parsable "$out2/slurm.sbatch" > "$tmp/sbatch_b2.txt" 2>&1 || fail "sbatch $out2/slurm.sbatch (exit $?)" -- "$tmp/sbatch_b2.txt"
job_b2=$(cut -d';' -f1 < "$tmp/sbatch_b2.txt")
jobs+=("$job_b2")
pass "resubmitted $out2/slurm.sbatch: job $job_b2"
log_b2=$out2/logs/${job_b2}_1.out
wait_job "$job_b2" 300 || fail "job $job_b2 still queued after 300 s" -- "$log_b2"
pass "job $job_b2 ended ($(tr '\n' ' ' < "$tmp/$job_b2.states" 2> /dev/null || echo purged))"
status=$(q "$db" "SELECT status FROM runs")
[ "$status" = "done" ] || fail "after the resubmission the run is '$status', expected 'done'" -- "$log_b2"
pass "run done"
grep -q ': resuming (' "$log_b2" || fail "second task's log has no 'resuming' line" -- "$log_b2"
if grep -q ': starting (' "$log_b2"; then fail "second task's log says 'starting': it began the run again" -- "$log_b2"; fi
pass "second task's log says resuming, not starting"
first_after=$(q "$db" "SELECT MIN(step) FROM train_log")
rows_after=$(q "$db" "SELECT COUNT(*) FROM train_log")
[ "$first_after" = "$first_step" ] || fail "train_log's first step is $first_after after the resume, $first_step before"
[ "$rows_after" -gt "$rows_cut" ] || fail "train_log has $rows_after rows after the resume, $rows_cut before"
pass "train_log kept the rows from before the cancel (first step $first_after; $rows_cut -> $rows_after rows)"

# ---------------------------------------------------------------- case C
echo "== case C: one run over two processes launched by srun (c10d over Gloo)"
cp "$here/tiny.toml" "$tmp/dp.toml"
"$chiar" run "$tmp/dp.toml" --only '*/seed=1' --set train.log_every=1 --db "$tmp/one.db" --threads 1 > "$tmp/one.txt" 2>&1 ||
  fail "chiar run (one process) (exit $?)" -- "$tmp/one.txt"
timeout 300 srun --ntasks 2 --cpus-per-task 1 "$chiar" run "$tmp/dp.toml" --only '*/seed=1' --set train.log_every=1 --db "$tmp/two.db" \
  --threads 1 > "$tmp/two.txt" 2>&1 || fail "srun --ntasks 2 chiar run (exit $?)" -- "$tmp/two.txt"
n=$(q "$tmp/two.db" "SELECT COUNT(*) FROM runs WHERE status = 'done' AND processes = 2")
[ "$n" = 2 ] || fail "two.db: $n of 2 runs done by 2 processes" -- "$tmp/two.txt"
pass "srun --ntasks 2: both runs done, recorded with 2 processes"
# The same losses as one process, within 1e-5 relative (float summation order).
q "$tmp/one.db" "SELECT r.hash, t.step, t.loss FROM train_log t JOIN runs r ON r.id = t.run_id ORDER BY 1, 2" > "$tmp/one.loss"
q "$tmp/two.db" "SELECT r.hash, t.step, t.loss FROM train_log t JOIN runs r ON r.id = t.run_id ORDER BY 1, 2" > "$tmp/two.loss"
[ -s "$tmp/one.loss" ] || fail "no training losses recorded" -- "$tmp/one.txt"
paste -d'|' "$tmp/one.loss" "$tmp/two.loss" | awk -F'|' '
  $1 != $4 || $2 != $5 { print "row " NR ": " $1 "@" $2 " vs " $4 "@" $5; bad = 1; next }
  { d = $3 - $6; if (d < 0) d = -d; if (d > 1e-5 * ($3 < 0 ? -$3 : $3)) { print $1 "@" $2 ": " $3 " vs " $6; bad = 1 } }
  END { exit bad }' > "$tmp/loss.diff" || fail "losses of 1 and 2 processes differ: $(head -n 3 "$tmp/loss.diff")"
pass "the same training losses as one process ($(wc -l < "$tmp/one.loss") logged steps, within 1e-5)"

ok=1
echo "PASS [slurm]: all checks in $(( $(date +%s) - test_start )) s"
