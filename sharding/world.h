// The MPI world this process belongs to: who we are (rank, world size, rank on this host), how the
// world starts, how it ends normally, and how it ends when one rank fails.
//
// Every process of a run is an MPI rank; a plain `trainer ...` without mpirun is an Open MPI
// singleton, a world of one, so there is a single code path. The local rank (rank among the
// processes sharing this host's memory) picks the GPU. MPI_COMM_WORLD is switched to
// MPI_ERRORS_RETURN so that a failed MPI call comes back to LLM_CHECK_MPI with rank, host and call
// named, instead of Open MPI's default handler killing the job with a generic message.
//
// Failure policy: a rank that cannot go on calls abort_world(). It prints its message once and
// calls MPI_Abort, which makes mpirun end every rank within seconds; the other ranks are probably
// waiting in a collective for the failed one and would otherwise wait forever.
//
// Threading: MPI_THREAD_FUNNELED. Only the thread that called start_world() makes MPI calls;
// OpenMP and LibTorch worker threads never do.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace llm {

struct World {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among the processes on this host; picks cuda:<local_rank>
  int local_size = 1;  // processes on this host
  std::string host;    // MPI_Get_processor_name
};

// Initialises MPI (once; a second call returns the same World), sets MPI_ERRORS_RETURN on
// MPI_COMM_WORLD, finds the local rank and fills llm::process_identity() (rank, world size, host).
World start_world(int* argc, char*** argv);

// torchrun (or torch.distributed.launch, or any launcher that sets WORLD_SIZE, RANK and LOCAL_RANK
// for processes it starts itself) does not make an MPI world: each of its processes would be an Open
// MPI singleton, a world of one training alone on the same device and into the same run folder.
// Throws UserError saying how to launch instead when this process is alone in its MPI world while
// WORLD_SIZE says it has peers; nothing when WORLD_SIZE is unset or 1, or when MPI started the world.
void refuse_launch_without_mpi(const World& world);

// The World that start_world() returned. Throws SystemError before start_world().
const World& current_world();

// MPI_Finalize, once; later calls do nothing. Every rank must call it (it is collective).
void stop_world();

// Every rank's `text` (at most 256 bytes kept), on every rank, in rank order. Collective over
// MPI_COMM_WORLD: what the ranks agree on at start-up (the run id, the hosts, the GPUs).
std::vector<std::string> all_gather_text(const std::string& text);

// Prints "[rank R on HOST] MESSAGE" to stderr once, then MPI_Abort(MPI_COMM_WORLD, exit_code) so
// that mpirun ends every rank. Without a live MPI world it just exits with exit_code.
[[noreturn]] void abort_world(int exit_code, const std::string& message);

// For a rank that learned from a collective that another rank failed: that rank prints its message
// and ends the job (abort_world); after a moment's wait, so that its message (which names the cause)
// comes first, this one throws UserError(message), which should say where to look.
[[noreturn]] void fail_after_another_rank(const std::string& message);

// True between MPI_Init and MPI_Finalize.
bool mpi_is_live();

// Runs a program's body and turns its failures into the project's exit codes: UserError 2,
// TrainingError 3, any other exception 1. In a world of more than one rank a failure goes through
// abort_world() (so no rank hangs); alone, it is printed to stderr. Calls stop_world() on success.
int run_reporting_failures(const World& world, const std::function<int()>& body);

}  // namespace llm
