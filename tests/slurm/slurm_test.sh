#!/usr/bin/env bash
# Slurm for real on this one machine: a one-host cluster (slurmctld, slurmd and a munged of its own,
# configured in a temporary folder, on loopback, without cgroups) and, on it:
#   1. srun --mpi=pmix with 2 and 4 tasks: every step's loss, gradient norm and lr equal to mpirun's run;
#   2. sbatch launch/slurm.sbatch: two jobs of one name in folders of their own (runs/<name>-<job id>);
#      the first, another --lr, stops at --stop_at_step and is not requeued; the second, sent USR1 as
#      Slurm's --signal sends it, saves and exits 0, the script requeues it, and the requeued job resumes
#      its own run (not the first job's) and ends with the uninterrupted run's losses.
#
#   bash tests/slurm/slurm_test.sh TRAINER MPIEXEC [PART]
#
# PART: srun_sbatch (1 and 2; ctest: slurm_srun_and_sbatch), time_limit (3, which waits out Slurm's
# one-minute minimum limit; ctest: slurm_time_limit), or all (the default). Each part starts a cluster
# of its own, so ctest runs the two side by side.
#
# Exit 77 (ctest's skip) naming what is missing where Slurm or munge is not installed (launch/setup.sh
# installs Debian's slurmctld, slurmd, slurm-client and munge) or the daemons cannot start here.
source "$(dirname "$0")/../cluster_test_lib.sh" "$1" "$2"
part=${3:-all}
case "$part" in srun_sbatch|time_limit|all) ;; *) fail "unknown part $part: srun_sbatch, time_limit or all" ;; esac
on_fail() { [ -n "${work:-}" ] && tail -n 20 "$work"/log/*.log "$work"/job/*.out 2>/dev/null; }
for tool in slurmctld slurmd srun sbatch squeue scontrol scancel munged; do
  command -v "$tool" >/dev/null || skip "no $tool here (Debian: apt-get install slurmctld slurmd slurm-client munge)"
done

work=$(mktemp -d /tmp/slurm_test.XXXXXX)
cleanup() {
  for daemon in slurmd slurmctld munged; do
    [ -f "$work/$daemon.pid" ] && kill "$(cat "$work/$daemon.pid")" 2>/dev/null
  done
  sleep 1
  rm -rf "$work"
}
trap cleanup EXIT
[ -n "${KEEP_SLURM_TEST:-}" ] && trap - EXIT  # keep the folder to look into
mkdir -p "$work"/{state,spool,log,munge,job,tmp}

# munge: a daemon of our own, on its own socket, with a fresh key.
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
chmod 700 "$work/munge"
munged --force --socket="$work/munge/munge.socket" --key-file="$work/munge/munge.key" \
       --pid-file="$work/munged.pid" --log-file="$work/log/munged.log" --seed-file="$work/munge/seed" \
  || skip "munged does not start here ($(tail -n 1 "$work/log/munged.log" 2>/dev/null))"

host=$(hostname -s)
# Two ports of our own, below Linux's ephemeral range (32768 up: a client socket could hold one) and
# 2 apart per pid, so the two parts that ctest runs side by side never take each other's.
port=$(( 20000 + ($$ % 6000) * 2 ))
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null; do
  port=$((port + 2))
done
cat > "$work/slurm.conf" <<CONF
ClusterName=trainer-test
SlurmctldHost=$host
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmdParameters=config_overrides
ReturnToService=2
# Two clusters side by side (ctest runs both parts at once) must share nothing in /tmp: PMIx's
# per-step folder is <TmpFS>/spmix_appdir_<uid>_<job>.<step>, and Open MPI's session folder follows
# the job id, so each cluster has a TmpFS of its own and job ids from its own port up.
TmpFS=$work/tmp
FirstJobId=$((port * 100))
NodeName=$host CPUs=4 Sockets=1 CoresPerSocket=4 ThreadsPerCore=1 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$work/slurm.conf"
slurmctld -f "$SLURM_CONF" || skip "slurmctld does not start here"
# The time-limit part's job trains until its limit nears (a minute, two ranks busy): at nice 10 (its
# tasks inherit slurmd's priority) it takes only what the other tests leave of the cores.
niceness=0
[ "$part" = time_limit ] && niceness=10
nice -n "$niceness" slurmd -f "$SLURM_CONF" || skip "slurmd does not start here"
for _ in $(seq 1 30); do
  [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break
  sleep 1
done
[ "$(sinfo -h -o %t 2>/dev/null)" = idle ] \
  || skip "the one-host cluster's node is not idle: $(sinfo -h -o '%t %E' 2>&1); slurmd's last error:" \
          "$(grep error "$work/log/slurmd.log" | tail -n 1)"
echo "one-host cluster up: $host, ports $port-$((port + 1)), $(srun --version)"

export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
flags=(--config "$SOURCE/configs/llama_micro.json" --device cpu --max_length 16 --total_batch_size 4
       --eval_every 0 --eval_batches 1 --warmup_steps 2 --lr 1e-2)

if [ "$part" != time_limit ]; then
# 1. srun with 2 and 4 tasks against mpirun.
for ranks in 2 4; do
  "$MPIEXEC" --oversubscribe -np "$ranks" "$TRAINER" "${flags[@]}" --batch_size $((4 / ranks)) \
    --num_training_steps 4 --run_dir "$work/mpirun_$ranks" > "$work/log/mpirun_$ranks.log" 2>&1 \
    || fail "mpirun -np $ranks: $(tail -n 3 "$work/log/mpirun_$ranks.log")"
  timeout 120 srun --mpi=pmix -n "$ranks" "$TRAINER" "${flags[@]}" --batch_size $((4 / ranks)) \
    --num_training_steps 4 --run_dir "$work/srun_$ranks" > "$work/log/srun_$ranks.log" 2>&1 \
    || fail "srun --mpi=pmix -n $ranks: $(tail -n 5 "$work/log/srun_$ranks.log")"
  grep -q "world_size\":$ranks" "$work/srun_$ranks/metrics.jsonl" || fail "srun -n $ranks: not one world of $ranks"
  [ "$(records "$work/mpirun_$ranks/metrics.jsonl")" = "$(records "$work/srun_$ranks/metrics.jsonl")" ] \
    || fail "srun -n $ranks and mpirun -np $ranks differ: $(records "$work/srun_$ranks/metrics.jsonl") vs $(records "$work/mpirun_$ranks/metrics.jsonl")"
  echo "srun --mpi=pmix -n $ranks: 4 steps, the same bits as mpirun -np $ranks"
done

# 2. sbatch: two jobs of one name; a signal mid-run, the save, the requeue, the resume.
name=same-name
# The first job: another experiment (--lr 3e-2) under the same job name, stopped at --stop_at_step.
first=$(cd "$work/job" && TRAINER="$TRAINER" sbatch --parsable -n 1 --job-name=$name --output="$work/job/first-%j.out" \
        "$SOURCE/launch/slurm.sbatch" "${flags[@]/1e-2/3e-2}" --batch_size 4 --num_training_steps 4 --stop_at_step 2) \
  || fail "sbatch refused the first job"
for _ in $(seq 1 120); do
  grep -q "not requeued\|requeueing job" "$work"/job/first-*.out 2>/dev/null && break
  sleep 1
done
grep -q "requeueing job $first" "$work"/job/first-*.out && fail "job $first, stopped at --stop_at_step, was requeued"
grep -q "not requeued" "$work"/job/first-*.out || fail "job $first did not end: $(tail -n 3 "$work"/job/first-*.out)"
first_run="$work/job/runs/$name-$first"
grep -q '"stopped_by":"--stop_at_step"' "$first_run/metrics.jsonl" || fail "job $first's run is not in $first_run"
[ -d "$first_run/checkpoints/step_2" ] || fail "job $first saved no step_2 in $first_run/checkpoints"
scancel "$first" 2>/dev/null
echo "sbatch job $first (--stop_at_step 2): ran in runs/$name-$first, saved step_2, not requeued"
# Long enough (about 2 s of steps on this model) that the poll below sees a step between the 5th and
# the last even on a loaded machine: at 60 steps (0.2 s) a loaded CI machine saw only the finished run.
steps=600
"$MPIEXEC" --oversubscribe -np 2 "$TRAINER" "${flags[@]}" --batch_size 2 --num_training_steps $steps \
  --run_dir "$work/straight" > "$work/log/straight.log" 2>&1 || fail "the uninterrupted run: $(tail -n 3 "$work/log/straight.log")"
job=$(cd "$work/job" && TRAINER="$TRAINER" \
      sbatch --parsable -n 2 --job-name=$name --output="$work/job/slurm-%j.out" "$SOURCE/launch/slurm.sbatch" \
      "${flags[@]}" --batch_size 2 --num_training_steps $steps --log_every 1) || fail "sbatch refused the job"
echo "submitted job $job"
mkdir -p "$work/job/runs" && ln -s "runs/$name-$job" "$work/job/run"  # its run folder, by the job id
# Once it trains (a few steps in), the notice Slurm's --signal=USR1@120 would send.
for _ in $(seq 1 600); do
  n=$(grep -c '"event":"train"' "$work/job/run/metrics.jsonl" 2>/dev/null || true)
  [ "${n:-0}" -ge 5 ] && break
  sleep 0.1
done
[ "${n:-0}" -ge 5 ] || fail "job $job did not start training"
scancel --signal=USR1 "$job" || fail "scancel --signal=USR1 $job"
echo "sent USR1 to job $job at step ${n}"
# The job saves and is requeued. Slurm holds a requeued batch job back for a while (its begin time,
# about two minutes in 22.05): start it now instead, as an operator may.
for _ in $(seq 1 300); do
  grep -q "requeueing job $job" "$work"/job/slurm-*.out 2>/dev/null && break
  sleep 0.2
done
grep -q "requeueing job $job" "$work"/job/slurm-*.out || fail "job $job was not requeued"
sleep 1
scontrol update JobId="$job" StartTime=now 2>/dev/null || true
# The second start resumes and ends.
for _ in $(seq 1 240); do
  grep -q '"event":"end"' "$work/job/run/metrics.jsonl" 2>/dev/null && ! squeue -h -j "$job" 2>/dev/null | grep -q . && break
  sleep 1
done
grep -q '"event":"preempted"' "$work/job/run/metrics.jsonl" || fail "job $job was not preempted by the signal"
grep -q "requeueing job $job" "$work"/job/slurm-*.out || fail "job $job was not requeued"
grep -q '"event":"end"' "$work/job/run/metrics.jsonl" || fail "job $job did not end after its requeue"
[ "$(grep -c '"event":"start"' "$work/job/run/metrics.jsonl")" -ge 2 ] || fail "job $job did not start twice"
[ "$(records "$work/job/run/metrics.jsonl")" = "$(records "$work/straight/metrics.jsonl")" ] \
  || fail "the preempted and requeued job's steps differ from the uninterrupted run's"
[ "$(grep -c '"event":"start"' "$first_run/metrics.jsonl")" -eq 1 ] || fail "job $job wrote into job $first's run folder"
[ "$(grep -c '"event":"train"' "$first_run/metrics.jsonl")" -eq 2 ] || fail "job $first's run folder changed"
echo "sbatch launch/slurm.sbatch: USR1 at step $n -> saved, exit 0, requeued, resumed; all $steps steps equal to the uninterrupted run"

fi

if [ "$part" != srun_sbatch ]; then
# 3. A job's time limit: the script hands the trainer the job's end time (--max_runtime), and the run
#    saves and exits 0 before Slurm ends the job; the script requeues it (and the test cancels it then).
#    The script's USR1 notice 120 s ahead would come first in a 1-minute job: the test swaps it for a
#    harmless SIGCONT (a command line's --signal overrides the script's), so the limit alone acts.
job=$(cd "$work/job" && RUN_DIR="$work/job/timed" SAVE_DIR="$work/job/timed_ckpt" TRAINER="$TRAINER" \
      sbatch --parsable -n 2 --time=1 --signal=CONT@1 --output="$work/job/timed-%j.out" "$SOURCE/launch/slurm.sbatch" \
      "${flags[@]}" --batch_size 2 --num_training_steps 10000000 --log_every 50) || fail "sbatch refused the timed job"
started=$(date +%s)
for _ in $(seq 1 120); do
  grep -q "requeueing job $job" "$work"/job/timed-*.out 2>/dev/null && break
  sleep 1
done
elapsed=$(( $(date +%s) - started ))
scancel "$job" 2>/dev/null
grep -q -- "--max_runtime 20" "$work"/job/timed-*.out || fail "the script did not pass the job's end time: $(head -n 2 "$work"/job/timed-*.out)"
grep -q '"stopped_by":"--max_runtime"' "$work/job/timed/metrics.jsonl" || fail "the timed job did not stop by --max_runtime: $(tail -n 3 "$work"/job/timed-*.out)"
grep -q "requeueing job $job" "$work"/job/timed-*.out || fail "the timed job was not requeued"
saved=$(ls -d "$work"/job/timed_ckpt/step_* 2>/dev/null | tail -n 1)
[ -n "$saved" ] || fail "the timed job saved nothing"
# Slurm's own end of a job at its limit says DUE TO TIME LIMIT; not CANCELLED AT, which the test's own
# scancel above writes into the same file when the requeued job has started again meanwhile.
grep -q "Exceeded job memory\|DUE TO TIME LIMIT" "$work"/job/timed-*.out && fail "Slurm ended the timed job before the trainer did"
echo "sbatch --time=1 launch/slurm.sbatch: the trainer stopped by --max_runtime (the job's end time), saved $(basename "$saved"), requeued after ${elapsed} s"
fi
