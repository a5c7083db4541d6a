#!/usr/bin/env bash
# Record real Slurm 22.05 output from the local dev cluster (scripts/dev-cluster up) into
# tests/data/slurm/22.05/, for the pure parsers' unit tests. Re-run to refresh the recordings.
#
# It submits a mix of jobs (tagged coral jobs, someone else's job, a job array, a hetjob, a held
# job, a job pending on resources, jobs that complete/fail/are cancelled/time out/node-fail),
# drains and downs nodes and partitions briefly, records every command the slurm layer runs,
# then cancels its jobs and restores every node and partition (also on error).
set -uo pipefail
export SLURM_CONF="${SLURM_CONF:-/var/tmp/coral-dev-cluster/etc/slurm.conf}"
OUT="$(cd "$(dirname "$0")" && pwd)/22.05"
WORK="$(mktemp -d)"
mkdir -p "$OUT"
: >"$WORK/jobs"

cleanup() {
  # shellcheck disable=SC2046
  [ -s "$WORK/jobs" ] && scancel $(cat "$WORK/jobs") 2>/dev/null
  for n in v100-02 a100-02; do scontrol update NodeName=$n State=RESUME 2>/dev/null; done
  for p in a100-80g v100; do scontrol update PartitionName=$p State=UP 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

tag() { echo "coral:deployment=$1;model=$2;replica=$3;template=$4"; }
# (ids go to a file: sub runs in a subshell when its output is captured)
sub() { local id; id=$(sbatch --parsable --output=/dev/null "$@" | cut -d';' -f1); echo "$id" >>"$WORK/jobs"; echo "$id"; }
rec() { local name=$1; shift; "$@" >"$OUT/$name" 2>"$OUT/$name.stderr"; echo $? >"$OUT/$name.rc";
        [ -s "$OUT/$name.stderr" ] || rm -f "$OUT/$name.stderr"; }

SQUEUE_FMT="JobID:|,HetJobID:|,HetJobOffset:|,ArrayJobID:|,ArrayTaskID:|,State:|,Reason:|,Partition:|,NodeList:|,NumNodes:|,SubmitTime:|,StartTime:|,EndTime:|,TimeLeft:|,TimeLimit:|,RestartCnt:|,tres-alloc:|,Name:|,Comment:|"
SACCT_FMT="JobID,JobIDRaw,JobName,Partition,State,ExitCode,Reason,AllocTRES,ElapsedRaw,Submit,Start,End,NNodes,NodeList,Comment"

# a tagged single-node replica with a step (.batch, .extern, .0)
A=$(sub -p a100 -w a100-01 --gres=gpu:a100:2 -c 8 --mem=32G -t 30 -J coral.dep1.llama.r1 \
      --comment="$(tag dep1 llama r1 a100x2)" --wrap="srun sleep 300")
# someone else's job (untagged comment) on the same node
sub -p a100 -w a100-01 --gres=gpu:a100:1 -t 30 -J somebody --comment="not ours" --wrap="sleep 300" >/dev/null
# a job array of 6 tasks, 2 at a time (pending tasks wait on JobArrayTaskLimit)
sub -p v100 --gres=gpu:v100:1 -t 30 --array=0-5%2 -J coral.dep1.mistral.arr \
    --comment="$(tag dep1 mistral arr v100x1)" --wrap="sleep 300" >/dev/null
# a heterogeneous job: a100 component + v100 component
cat >"$WORK/het.sh" <<HET
#!/bin/bash
#SBATCH -p a100 -w a100-01 --gres=gpu:a100:1 -N1 -t 30 -J coral.dep1.qwen.h1
#SBATCH --comment=$(tag dep1 qwen h1 a100x1-v100x2)
#SBATCH hetjob
#SBATCH -p v100 --gres=gpu:v100:2 -N1 -t 30
srun --het-group=0 sleep 300 : --het-group=1 sleep 300
HET
sub "$WORK/het.sh" >/dev/null
# a held job of another deployment, and a job pending on resources with an expected start
sub --hold -p a100 --gres=gpu:a100:1 -t 30 -J coral.dep2.llama.r9 --comment="$(tag dep2 llama r9 a100x1)" --wrap="sleep 1" >/dev/null
sub -p a100-80g --gres=gpu:a100-80g:8 -t 30 -J coral.dep1.big.r2 --comment="$(tag dep1 big r2 a100-80gx8)" --wrap="sleep 25" >/dev/null
sub -p a100-80g --gres=gpu:a100-80g:4 -t 30 -J coral.dep1.big.r3 --comment="$(tag dep1 big r3 a100-80gx8)" --wrap="sleep 300" >/dev/null
# finished jobs: completed, failed, cancelled, and one that will time out (1 minute limit)
sub -p v100 --gres=gpu:v100:1 -t 5 -J coral.dep1.done.r1 --comment="$(tag dep1 done r1 v100x1)" --wrap="true" >/dev/null
sub -p v100 --gres=gpu:v100:1 -t 5 -J coral.dep1.fail.r1 --comment="$(tag dep1 fail r1 v100x1)" --wrap="exit 3" >/dev/null
C=$(sub -p v100 --gres=gpu:v100:1 -t 5 -J coral.dep1.cxl.r1 --comment="$(tag dep1 cxl r1 v100x1)" --wrap="sleep 300")
T=$(sub -p a100-80g --gres=gpu:a100-80g:1 -t 1 -J coral.dep1.tmo.r1 --comment="$(tag dep1 tmo r1 a100-80gx1)" --wrap="sleep 300")
sleep 6
scancel "$C"
sleep 2

# a draining node (job running on it) and a drained idle node
scontrol update NodeName=v100-02 State=DRAIN Reason="coral-record maintenance"
scontrol update NodeName=a100-02 State=DRAIN Reason="coral-record idle drain"
sleep 1
rec scontrol_show_node.txt scontrol show node -o
rec scontrol_show_partition.txt scontrol show partition -o
rec sinfo.json sinfo --json
rec squeue_own.txt squeue -h -t all -u root -O "$SQUEUE_FMT"
rec squeue.json squeue --json
# sacct while jobs run: 22.05 stores the comment only when a job ends (the name is there at once)
rec sacct_running.txt sacct -n -P -X --duplicates -S now-1hours -E now -o "$SACCT_FMT"
rec squeue_steps.txt squeue -h -s -u root
rec version.txt sinfo --version
rec sbatch_test_only.txt sbatch --test-only -p a100-80g --gres=gpu:a100-80g:8 -N1 -t 60 --wrap=true
rec sbatch_test_only_now.txt sbatch --test-only -p v100 --gres=gpu:v100:1 -N1 -t 60 --wrap=true
scontrol update NodeName=v100-02 State=RESUME
scontrol update NodeName=a100-02 State=RESUME

# partition states
scontrol update PartitionName=a100-80g State=DRAIN
scontrol update PartitionName=v100 State=DOWN
rec scontrol_show_partition_drain_down.txt scontrol show partition -o
rec sbatch_partition_drain.txt sbatch --parsable -p a100-80g --gres=gpu:a100-80g:1 -t 5 --wrap=true
scontrol update PartitionName=v100 State=INACTIVE
rec scontrol_show_partition_inactive.txt scontrol show partition -o
scontrol update PartitionName=a100-80g State=UP
scontrol update PartitionName=v100 State=UP

# permanent errors
rec sbatch_bad_partition.txt sbatch --parsable -p nosuch --wrap=true
rec sbatch_bad_account.txt sbatch --parsable -p v100 -A nosuch --wrap=true
rec sbatch_bad_qos.txt sbatch --parsable -p v100 --qos=nosuch --wrap=true
rec sbatch_bad_gres.txt sbatch --parsable -p v100 --gres=gpu:a100:1 --wrap=true
rec sbatch_too_many_gpus.txt sbatch --parsable -p v100 --gres=gpu:v100:9 --wrap=true
rec squeue_bad_job.txt squeue -h -j 99999999 -O "$SQUEUE_FMT"
rec scancel_bad_job.txt scancel 99999999

# transient: the controller and slurmdbd unreachable (a copy of the conf pointing at closed ports)
sed -e 's/^SlurmctldPort=.*/SlurmctldPort=1/' -e 's/^AccountingStoragePort=.*/AccountingStoragePort=1/' \
    "$SLURM_CONF" >"$WORK/slurm.conf"
cp "$(dirname "$SLURM_CONF")/gres.conf" "$WORK/" 2>/dev/null
for cmd in "scontrol show node -o" "scontrol show partition -o" "squeue -h" "sbatch --wrap=true" "scancel 1" "sinfo"; do
  name="unreachable_$(echo "$cmd" | tr ' =-' '___' | tr -s '_').txt"
  SLURM_CONF="$WORK/slurm.conf" timeout 60 $cmd >"$OUT/$name" 2>"$OUT/$name.stderr"; echo $? >"$OUT/$name.rc"
done
SLURM_CONF="$WORK/slurm.conf" timeout 60 sacct -n -P -X -S now-1hours -o JobID >"$OUT/unreachable_sacct.txt" 2>"$OUT/unreachable_sacct.txt.stderr"; echo $? >"$OUT/unreachable_sacct.txt.rc"
SLURM_CONF="$WORK/slurm.conf" timeout 60 sacctmgr -n -P show qos >"$OUT/unreachable_sacctmgr.txt" 2>"$OUT/unreachable_sacctmgr.txt.stderr"; echo $? >"$OUT/unreachable_sacctmgr.txt.rc"

# a node failure: a no-requeue job on v100-02 (nothing else there), node set DOWN, then resumed
squeue -h -w v100-02 -o %i | grep -q . && echo "v100-02 busy; node-fail part may hit others' jobs" >&2
NF=$(sub -p v100 -w v100-02 --no-requeue --gres=gpu:v100:1 -t 5 -J coral.dep1.nf.r1 --comment="$(tag dep1 nf r1 v100x1)" --wrap="sleep 300")
sleep 4
scontrol update NodeName=v100-02 State=DOWN Reason="coral-record node failure"
sleep 2
rec scontrol_show_node_down.txt scontrol show node -o
scontrol update NodeName=v100-02 State=RESUME

# wait for the 1-minute job to time out, then let accounting catch up
for _ in $(seq 1 60); do squeue -h -j "$T" -o %T 2>/dev/null | grep -q -E "RUNNING|PENDING" || break; sleep 3; done
sleep 3
rec squeue_job_states.txt squeue -h -t all -j "$(paste -sd, "$WORK/jobs")" -O "$SQUEUE_FMT"
rec sacct_job_states.txt sacct -n -P -X -j "$(paste -sd, "$WORK/jobs")" -o "$SACCT_FMT"
rec sacct_own.txt sacct -n -P -X --duplicates -S now-1hours -E now -o "$SACCT_FMT"
rec sacct_steps.txt sacct -n -P --duplicates -j "$(paste -sd, "$WORK/jobs")" -o "$SACCT_FMT"
rec sacct.json sacct --json -S now-1hours
rec sacctmgr_assoc.txt sacctmgr -n -P show assoc where user=root format=Account,User,Partition,QOS,DefaultQOS,GrpTRES,MaxTRES,GrpJobs,MaxJobs,MaxSubmit
rec sacctmgr_qos.txt sacctmgr -n -P show qos format=Name,GrpTRES,MaxTRES,MaxTRESPU,GrpJobs,MaxJobsPU,MaxSubmitPU
echo "recorded into $OUT; jobs: $(paste -sd' ' "$WORK/jobs")"
