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
shell=$(readlink "/proc/$$/exe")
child=
pending=
passed=
repeater=
interrupts=0
# Whether process $1 has a handler for SIGUSR1 (signal 10: bit 9 of SigCgt in /proc/<pid>/status).
catches_usr1() {
  local key mask
  while read -r key mask; do
    [ "$key" = SigCgt: ] && return $(( ((16#$mask >> 9) & 1) == 0 ))
  done < "/proc/$1/status" 2>/dev/null
  return 1
}
# mpirun's children that handle SIGUSR1: the local ranks once their handlers are in (a child between
# fork and exec runs mpirun's own program and is left out).
ranks_catching_usr1() {
  local launcher pid
  launcher=$(readlink "/proc/$child/exe" 2>/dev/null) || return 0
  for pid in $(cat /proc/"$child"/task/*/children 2>/dev/null); do
    [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" != "$launcher" ] && catches_usr1 "$pid" && echo "$pid"
  done
  return 0
}
pass_on() {
  local signal=$1 known
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
  echo "launch/mpirun.sh: SIG$signal passed to every rank as SIGUSR1 (each saves at the next step boundary" \
       "when --save_dir is set, then exits)" >&2
  # mpirun forwards SIGUSR1 once its handler is in; until then (its first moments) it would die of it.
  for _ in $(seq 200); do
    [ "$(readlink "/proc/$child/exe" 2>/dev/null)" != "$shell" ] && catches_usr1 "$child" && break
    kill -0 "$child" 2>/dev/null || break
    sleep 0.05
  done
  known=" $(ranks_catching_usr1 | tr '\n' ' ')"
  kill -USR1 "$child" 2>/dev/null
  # mpirun forwards a signal only to the ranks it has started: one that comes while it is still
  # forking a rank (between fork and exec) is lost, and that rank would train on. So, for 5 s, each
  # time another local rank has put its handler in, forward it once more; the ranks that have it
  # already ignore the repeat (trainer/preemption.h). (Never blindly: mpirun, once it is ending,
  # dies of SIGUSR1.)
  if [ -z "$passed" ]; then
    (
      for _ in $(seq 25); do
        sleep 0.2
        new=
        for pid in $(ranks_catching_usr1); do
          case "$known" in *" $pid "*) ;; *) known="$known$pid " new=1 ;; esac
        done
        [ -n "$new" ] && { kill -USR1 "$child" 2>/dev/null || exit 0; }
      done
    ) >/dev/null 2>&1 &
    repeater=$!
  fi
  passed=$signal
}
for signal in TERM INT HUP USR1; do
  trap "pass_on $signal" "$signal"
done
# A background command of a script is not a process group leader, so setsid execs mpirun itself (no
# fork): $! is mpirun's pid. (SIGKILL to this script leaves mpirun running in its own session: kill
# mpirun itself then.)
setsid "$mpiexec" "$@" &
child=$!
[ -n "$pending" ] && pass_on "$pending"  # a signal that came before mpirun started
# A trapped signal ends `wait` early (status above 128); wait again until mpirun itself has ended,
# then once more for its status (bash keeps it).
while kill -0 "$child" 2>/dev/null; do
  wait "$child"
done
wait "$child"
status=$?
[ -n "$repeater" ] && kill "$repeater" 2>/dev/null
# A rank still loading its libraries has no handler yet and dies of SIGUSR1 (128 + 10): the job was
# stopped before training began, which mpirun does not say.
if [ -n "$passed" ] && [ "$status" -eq 138 ]; then
  echo "launch/mpirun.sh: SIG$passed came while the ranks were still starting, before they could handle it:" \
       "the job stopped before training began, so nothing was trained and nothing is lost; start it again" >&2
fi
exit "$status"
