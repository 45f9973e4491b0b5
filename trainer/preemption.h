// Preemption: SIGTERM, SIGINT, SIGUSR1 or SIGHUP (a cluster's notice, a closed terminal; mpirun forwards
// SIGUSR1 to every rank, launch/mpirun.sh passes the others on as it)
// ends a training run at a step boundary, with a checkpoint of the step just finished when
// --save_dir is set, instead of ending the process mid-step with nothing saved.
//
// The handler only records the signal in an atomic (nothing else is async-signal-safe). Any rank may
// be the one signalled, so at each step boundary the ranks agree: one all-reduce of which signals each
// has seen (preemption_agreed), and all stop after the same step. The first signal is the one named;
// a later SIGTERM or SIGUSR1 (a scheduler repeating its notice while the checkpoint is written)
// changes nothing and does not kill the process, which is why the handlers stay installed to the end.
// A second SIGINT (Ctrl-C pressed again at a terminal) ends the process at once, exit status 130.
//
// --preemption_grace_seconds G (0: no limit): how long the cluster waits after its notice before it
// kills the job. G seconds after the first signal, a process whose step and save have not finished
// ends itself with exit status 128 + the signal and says so: a save it was writing never completes
// (its step_<N>.tmp is not a checkpoint), so the previous checkpoint stays the newest, and the job is
// gone before the kill rather than killed mid-write with no word.
#pragma once

namespace llm {

class Communicator;

// Installs the handlers for SIGTERM, SIGINT, SIGUSR1 and SIGHUP (again on each call: after a library that may
// have set its own, such as MPI).
void install_preemption_handlers();
// For a command that does not train (prepare, export, report, estimate, --print_config): the signals'
// default actions back, and a signal recorded meanwhile acted on now.
void restore_default_signal_actions();

// Starts the thread that holds the grace period (once; 0 or less: none).
void start_preemption_deadline(double grace_seconds);

// The first preemption signal this process received, 0 for none.
int preemption_signal_received();

// Collective over `communicator` (one all-reduce of three counters): the preemption signal any rank
// has received, 0 when none has; the same on every rank. When ranks received different ones, SIGINT
// is named before SIGUSR1 before SIGHUP before SIGTERM. With `written` (every rank passes it or none: an
// asynchronous save in flight, checkpoint/checkpoint.h's BackgroundSave), the same all-reduce carries a
// fourth counter: in, whether this rank's files are written; out, whether every rank's are. With
// `write_failed` (every rank passes it or none), one more: in, whether this rank could not write a run
// file (common/output_files.h, a pending failure); out, whether any rank could not. With `time_up`
// (every rank or none), one more: in, whether this rank finds --max_runtime reached; out, whether any
// rank does (their clocks may differ by a little: all stop after the same step).
int preemption_agreed(Communicator& communicator, bool* written = nullptr, bool* write_failed = nullptr,
                      bool* time_up = nullptr);

// "SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP", else "a signal".
const char* signal_name(int signal);

}  // namespace llm
