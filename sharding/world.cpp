#include "sharding/world.h"

#include <mpi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "common/errors.h"
#include "common/log.h"

namespace llm {
namespace {

std::optional<World>& started_world() {
  static std::optional<World> world;
  return world;
}

}  // namespace

bool mpi_is_live() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

World start_world(int* argc, char*** argv) {
  if (started_world()) return *started_world();

  int provided = MPI_THREAD_SINGLE;
  // Before MPI_ERRORS_RETURN is set a failure here aborts inside MPI; the check still names it.
  LLM_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  LLM_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));

  World world;
  LLM_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world.rank));
  LLM_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world.world_size));

  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_length = 0;
  LLM_CHECK_MPI(MPI_Get_processor_name(host, &host_length));
  world.host.assign(host, static_cast<size_t>(host_length));

  ProcessIdentity& identity = process_identity();
  identity.rank = world.rank;
  identity.world_size = world.world_size;
  identity.host = world.host;

  // Ranks that share memory are the ranks on this host; ordering them by world rank makes the
  // local rank stable from run to run.
  MPI_Comm host_comm = MPI_COMM_NULL;
  LLM_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank,
                                    MPI_INFO_NULL, &host_comm));
  LLM_CHECK_MPI(MPI_Comm_rank(host_comm, &world.local_rank));
  LLM_CHECK_MPI(MPI_Comm_size(host_comm, &world.local_size));
  LLM_CHECK_MPI(MPI_Comm_free(&host_comm));

  if (provided < MPI_THREAD_FUNNELED)
    log::warn("MPI provides thread level " + std::to_string(provided) +
              ", below MPI_THREAD_FUNNELED; OpenMP and LibTorch threads are safe only because "
              "they make no MPI calls");
  started_world() = world;
  return world;
}

const World& current_world() {
  if (!started_world())
    throw SystemError("current_world() called before start_world(): call start_world() first "
                      "thing in main()");
  return *started_world();
}

void stop_world() {
  if (!mpi_is_live()) return;
  LLM_CHECK_MPI(MPI_Finalize());
}

void abort_world(int exit_code, const std::string& message) {
  static std::atomic<bool> printed{false};
  if (!printed.exchange(true)) {
    const ProcessIdentity& who = process_identity();
    std::fprintf(stderr, "[rank %d on %s] %s\n", who.rank, who.host.c_str(), message.c_str());
    std::fflush(stderr);
  }
  std::fflush(stdout);
  if (mpi_is_live()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this covers a world that never started
}

int run_reporting_failures(const World& world, const std::function<int()>& body) {
  int exit_code = 0;
  std::string failure;
  try {
    exit_code = body();
  } catch (const UserError& error) {
    exit_code = 2;
    failure = std::string("error: ") + error.what();
  } catch (const TrainingError& error) {
    exit_code = 3;
    failure = std::string("training stopped: ") + error.what();
  } catch (const std::exception& error) {
    exit_code = 1;
    failure = std::string("fatal: ") + error.what();
  }
  if (!failure.empty()) {
    if (world.world_size > 1) abort_world(exit_code, failure);
    std::fprintf(stderr, "%s\n", failure.c_str());
  }
  stop_world();
  return exit_code;
}

}  // namespace llm
