#!/usr/bin/env bash
# mpirun, made safe to preempt: a scheduler's SIGTERM (or SIGINT, SIGHUP) sent to this script reaches
# every rank, which saves at the next step boundary and exits 0, as a signal sent to the ranks does.
#   bash launch/mpirun.sh -np 4 build/trainer --config configs/llama_350m.json --save_dir ckpt ...
# Every argument goes to mpirun (MPIEXEC names another one); the exit status is mpirun's.
#
# Why: Open MPI 4.1's mpirun, sent SIGTERM or SIGINT itself, aborts the job. It kills the ranks about a
# second later (before a checkpoint can be written), and with a longer odls_base_sigkill_timeout it
# stops relaying the ranks' output while it waits, so a rank that logs blocks on its pipe. mpirun does
# forward SIGUSR1 to every rank and lets the job end by itself; so this script runs mpirun in a
# session of its own (a terminal's Ctrl-C reaches only this script) and passes each of those signals
# on as SIGUSR1. The trainer then records "preempted by SIGUSR1". A second SIGINT (Ctrl-C again) is
# passed on as SIGINT: mpirun aborts the job at once, as a second Ctrl-C does to the trainer alone.
set -u
set +m  # no job control: the background mpirun is then no process-group leader (see setsid below)
mpiexec=${MPIEXEC:-mpirun}
child=
pending=
passed=
interrupts=0
pass_on() {
  local signal=$1
  if [ -z "$child" ]; then  # before mpirun has started: passed on as soon as it has
    pending=$signal
    return
  fi
  if [ "$signal" = INT ]; then
    interrupts=$((interrupts + 1))
    if [ "$interrupts" -gt 1 ]; then
      echo "launch/mpirun.sh: second SIGINT: aborting the job at once (mpirun gets SIGINT)" >&2
      kill -INT "$child" 2>/dev/null
      return
    fi
  fi
  passed=$signal
  echo "launch/mpirun.sh: SIG$signal passed to every rank as SIGUSR1 (each saves at the next step boundary" \
       "when --save_dir is set, then exits)" >&2
  kill -USR1 "$child" 2>/dev/null
}
for signal in TERM INT HUP USR1; do
  trap "pass_on $signal" "$signal"
done
# A background command of a script is not a process group leader, so setsid execs mpirun itself (no
# fork): $! is mpirun's pid. (SIGKILL to this script leaves mpirun running in its own session: kill
# mpirun itself then.)
setsid "$mpiexec" "$@" &
child=$!
# A signal that came before mpirun started: mpirun forwards SIGUSR1 only once its handlers are in, so
# give it a moment.
if [ -n "$pending" ]; then
  sleep 1
  pass_on "$pending"
fi
# A trapped signal ends `wait` early (status above 128); wait again until mpirun itself has ended,
# then once more for its status (bash keeps it).
while kill -0 "$child" 2>/dev/null; do
  wait "$child"
done
wait "$child"
status=$?
# A rank still loading its libraries has no handler yet and dies of SIGUSR1 (128 + 10): the job was
# stopped before training began, which mpirun does not say.
if [ -n "$passed" ] && [ "$status" -eq 138 ]; then
  echo "launch/mpirun.sh: SIG$passed came while the ranks were still starting, before they could handle it:" \
       "the job stopped before training began, so nothing was trained and nothing is lost; start it again" >&2
fi
exit "$status"
