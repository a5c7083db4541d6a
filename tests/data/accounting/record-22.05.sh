#!/usr/bin/env bash
# Record real sacct output from the local dev cluster (scripts/dev-cluster up) into
# tests/data/accounting/22.05/, for the accounting unit tests (coral_hpc.accounting).
#
# Jobs of known shape, all tagged as deployment "acctrec" (JobTag name + comment):
#   done    v100  2×v100, 8 CPUs, 64G   sleep 4   completed
#   cross   a100  2×a100, 8 CPUs, 64G   sleep 8   completed; the tests put the range start inside it
#   run     a100  1×a100, 4 CPUs, 32G   sleep 600 still RUNNING when recorded (cancelled afterwards)
#   rq      v100  1×v100, 4 CPUs, 32G   sleep 5   requeued after ~3 s (scontrol requeue), runs again
#   het     a100 1×a100 (4 CPUs, 32G) + v100 2×v100 (8 CPUs, 64G) hetjob, sleep 4
#   other   v100  1×v100   someone else's job (no coral tag): must not be counted
# It records the same sacct command line the Slurm layer records (tests/data/slurm/record-22.05.sh),
# plus sacct --json, the wall-clock time of the recording (for the running job) and the job ids.
set -uo pipefail
export SLURM_CONF="${SLURM_CONF:-/var/tmp/coral-dev-cluster/etc/slurm.conf}"
OUT="$(cd "$(dirname "$0")" && pwd)/22.05"
WORK="$(mktemp -d)"
mkdir -p "$OUT"
# job ids go to a file: `X=$(sub ...)` runs sub in a subshell, where an array append is lost
cleanup() { [ -s "$WORK/jobs" ] && scancel $(cat "$WORK/jobs") 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

tag() { echo "coral:deployment=acctrec;model=$1;replica=$2;template=$3"; }
sub() { local id; id=$(sbatch --parsable "$@" | cut -d';' -f1); echo "$id" >>"$WORK/jobs"; echo "$id"; }
state() { squeue -h -j "$1" -o %T 2>/dev/null | head -1; }
wait_gone() { for _ in $(seq 1 120); do [ -z "$(state "$1")" ] && return 0; sleep 1; done; return 1; }
wait_running() { for _ in $(seq 1 60); do [ "$(state "$1")" = RUNNING ] && return 0; sleep 0.5; done; return 1; }

SACCT_FMT="JobID,JobIDRaw,JobName,Partition,State,ExitCode,Reason,AllocTRES,ElapsedRaw,Submit,Start,End,NNodes,NodeList,Comment"
BEGIN=$(date +%s)
sleep 1

DONE=$(sub -p v100 --gres=gpu:v100:2 -c 8 --mem=64G -t 5 -J coral.acctrec.done.r1 \
        --comment="$(tag done r1 v100x2)" --wrap="sleep 4")
CROSS=$(sub -p a100 --gres=gpu:a100:2 -c 8 --mem=64G -t 5 -J coral.acctrec.cross.r1 \
        --comment="$(tag cross r1 a100x2)" --wrap="sleep 8")
RUN=$(sub -p a100 --gres=gpu:a100:1 -c 4 --mem=32G -t 30 -J coral.acctrec.run.r1 \
        --comment="$(tag run r1 a100x1)" --wrap="sleep 600")
RQ=$(sub -p v100 --gres=gpu:v100:1 -c 4 --mem=32G -t 5 -J coral.acctrec.rq.r1 \
        --comment="$(tag rq r1 v100x1)" --wrap="sleep 5")
OTHER=$(sub -p v100 --gres=gpu:v100:1 -t 5 -J somebody-else --comment="not ours" --wrap="sleep 3")
cat >"$WORK/het.sh" <<HET
#!/bin/bash
#SBATCH -p a100 --gres=gpu:a100:1 -c 4 --mem=32G -N1 -t 5 -J coral.acctrec.het.r1
#SBATCH --comment=$(tag het r1 a100x1-v100x2)
#SBATCH hetjob
#SBATCH -p v100 --gres=gpu:v100:2 -c 8 --mem=64G -N1 -t 5
sleep 4
HET
HET=$(sub "$WORK/het.sh")

wait_running "$RQ" || { echo "job $RQ never ran" >&2; exit 1; }
sleep 3
scontrol requeue "$RQ"
# A requeued batch job waits ~2 min (BeginTime) before it is eligible again: make it eligible now.
sleep 1
scontrol update JobId="$RQ" StartTime=now

for j in "$DONE" "$CROSS" "$RQ" "$HET" "$OTHER"; do wait_gone "$j" || echo "job $j still queued" >&2; done
wait_running "$RUN" || echo "job $RUN not running" >&2
# sacct lags behind squeue by a moment: let slurmdbd catch up
sleep 3
NOW=$(date +%s)
echo "$NOW" >"$OUT/now.txt"
echo "$BEGIN" >"$OUT/begin.txt"
date +%Z >"$OUT/timezone.txt"
printf 'done=%s\ncross=%s\nrun=%s\nrq=%s\nhet=%s\nother=%s\n' \
  "$DONE" "$CROSS" "$RUN" "$RQ" "$HET" "$OTHER" >"$OUT/jobs.txt"
S=$(date -d "@$BEGIN" +%Y-%m-%dT%H:%M:%S)
E=$(date -d "@$NOW" +%Y-%m-%dT%H:%M:%S)
sacct -n -P -X --duplicates -S "$S" -E "$E" -o "$SACCT_FMT" >"$OUT/sacct_own.txt" 2>"$OUT/sacct_own.txt.stderr"
echo $? >"$OUT/sacct_own.txt.rc"
sacct --json --duplicates -S "$S" -E "$E" >"$OUT/sacct.json" 2>"$OUT/sacct.json.stderr"
echo $? >"$OUT/sacct.json.rc"
for f in "$OUT"/*.stderr; do [ -s "$f" ] || rm -f "$f"; done
# the partitions' billing weights at recording time (billing-priced tests use them)
scontrol show partition -o >"$OUT/scontrol_show_partition.txt"
echo "recorded into $OUT; jobs: $(tr '\n' ' ' <"$WORK/jobs")"
