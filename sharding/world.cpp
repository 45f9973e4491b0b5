#include "sharding/world.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <optional>
#include <string>
#include <thread>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include "common/allocation_failure.h"
#include "common/errors.h"
#include "common/log.h"

namespace llm {
namespace {

std::optional<World>& started_world() {
  static std::optional<World> world;
  return world;
}

// LibTorch throws c10::Error where a CAFFE_ENFORCE fails (its CPU allocator's "can't allocate
// memory" is one) unless FLAGS_caffe2_use_fatal_for_enforce is set, when it aborts the process
// (SIGABRT and a backtrace) instead. Nobody sets it, but it is not false in the trainer: the system's
// libsentencepiece defines its own FLAGS_minloglevel (an absl::Flag<int>, 24 bytes) and its
// constructor, bound by the dynamic linker to libc10's 4-byte FLAGS_minloglevel, writes its vtable
// pointer over the flag next to it. So it is set back to false before the trainer runs (the byte
// written is the top half of that pointer, which is never read: the flag object is not called
// through its vtable).
void let_torch_throw_on_failed_checks() { FLAGS_caffe2_use_fatal_for_enforce = false; }

// A process no launcher started (no mpirun, srun or PMIx server named in its environment) is an Open
// MPI singleton: a world of one that never talks to another process. Open MPI 4.1 probes every message
// layer for it, and the Omni-Path library's (libpsm2) constructor calibrates a timer with sleeps on
// each CPU before it finds no such hardware: 0.2 s of start-up for nothing, which every `trainer
// estimate`, `report`, `export` and one-rank run paid. ob1 (shared memory and TCP) is all a world of
// one could use. And a singleton starts a daemon (orted) beside it, 50 ms of CPU, unless it is
// isolated (ess_singleton_isolated); isolated singletons would all share one session folder, and one
// that ends removes it under another that starts ("A call to mkdir was unable to create the desired
// directory"), so each gets a folder of its own (orte_tmpdir_base), removed when MPI is finalized.
// A setting the user made in the environment wins.
std::string& singleton_session_folder() {
  static std::string folder;
  return folder;
}

void configure_singleton_start() {
  for (const char* launched : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "OMPI_MCA_orte_hnp_uri"})
    if (std::getenv(launched) != nullptr) return;
  ::setenv("OMPI_MCA_pml", "ob1", /*overwrite=*/0);
  if (std::getenv("OMPI_MCA_ess_singleton_isolated") != nullptr || std::getenv("OMPI_MCA_orte_tmpdir_base") != nullptr)
    return;
  const char* temp = std::getenv("TMPDIR");
  std::string pattern = std::string(temp != nullptr && *temp != '\0' ? temp : "/tmp") + "/llm-trainer-mpi-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) return;  // then the daemon it is
  singleton_session_folder() = pattern;
  ::setenv("OMPI_MCA_orte_tmpdir_base", pattern.c_str(), /*overwrite=*/1);
  ::setenv("OMPI_MCA_ess_singleton_isolated", "1", /*overwrite=*/1);
}

void remove_singleton_session_folder() {
  if (singleton_session_folder().empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(singleton_session_folder(), ignored);
  singleton_session_folder().clear();
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
  let_torch_throw_on_failed_checks();

  configure_singleton_start();
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

namespace {

// An environment variable read as a count: its value if it is a whole number, else 0.
long count_from_environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return 0;
  char* end = nullptr;
  const long count = std::strtol(value, &end, 10);
  return end == value || *end != '\0' ? 0 : count;
}

std::string environment_setting(const char* name) {
  const char* value = std::getenv(name);
  return std::string(name) + "=" + (value != nullptr ? value : "(unset)");
}

}  // namespace

void refuse_launch_without_mpi(const World& world) {
  if (world.world_size > 1) return;
  auto how = [](long n) {
    const std::string count = std::to_string(n);
    return "The trainer's ranks are MPI ranks: launch with `mpirun -np " + count +
           " build/trainer ...`, or under Slurm `srun --mpi=pmix -n " + count +
           " build/trainer ...`; one process needs no launcher.";
  };
  if (const long peers = count_from_environment("WORLD_SIZE"); peers > 1)
    throw UserError("launcher: this process was started with " + environment_setting("WORLD_SIZE") + " " +
                    environment_setting("RANK") + " " + environment_setting("LOCAL_RANK") +
                    " (torchrun or a launcher like it) but not by MPI, so it is alone in its world: each of the " +
                    std::to_string(peers) +
                    " processes would train a model of its own on the same device and into the same run "
                    "folder. " + how(peers));
  // srun without an MPI plugin starts the tasks, but MPI does not join them (Open MPI needs PMIx).
  if (const long tasks = count_from_environment("SLURM_STEP_NUM_TASKS"); tasks > 1)
    throw UserError("launcher: srun started " + std::to_string(tasks) + " tasks (" +
                    environment_setting("SLURM_PROCID") +
                    ") but MPI did not join them, so each is alone in its world: run `srun --mpi=pmix -n " +
                    std::to_string(tasks) + " build/trainer ...` (`srun --mpi=list` shows the plugins).");
}

const World& current_world() {
  if (!started_world())
    throw SystemError("current_world() called before start_world(): call start_world() first "
                      "thing in main()");
  return *started_world();
}

std::vector<std::string> all_gather_text(const std::string& text) {
  constexpr int kWidth = 257;  // 256 bytes and the terminating zero
  char mine[kWidth] = {};
  text.copy(mine, kWidth - 1);
  const World& world = current_world();
  std::vector<char> every(static_cast<size_t>(kWidth) * static_cast<size_t>(world.world_size));
  LLM_CHECK_MPI(MPI_Allgather(mine, kWidth, MPI_CHAR, every.data(), kWidth, MPI_CHAR, MPI_COMM_WORLD));
  std::vector<std::string> texts;
  for (int r = 0; r < world.world_size; ++r) texts.emplace_back(every.data() + static_cast<size_t>(r) * kWidth);
  return texts;
}

void stop_world() {
  if (!mpi_is_live()) return;
  LLM_CHECK_MPI(MPI_Finalize());
  remove_singleton_session_folder();
}

void fail_after_another_rank(const std::string& message) {
  std::this_thread::sleep_for(std::chrono::seconds(2));
  throw UserError(message);
}

void abort_world(int exit_code, const std::string& message) {
  static std::atomic<bool> printed{false};
  if (!printed.exchange(true)) {
    const ProcessIdentity& who = process_identity();
    std::fprintf(stderr, "[rank %d on %s] %s\n", who.rank, who.host.c_str(), message.c_str());
    std::fflush(stderr);
  }
  std::fflush(stdout);
  remove_singleton_session_folder();  // a world of one: nothing of it is needed past this point
  if (mpi_is_live()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this covers a world that never started
}

int run_reporting_failures(const World& world, const std::function<int()>& body) {
  let_torch_throw_on_failed_checks();
  int exit_code = 0;
  std::string failure;
  try {
    exit_code = body();
  } catch (const UserError& error) {  // AllocationFailed too: an allocation that names what it was
    exit_code = 2;
    failure = std::string("error: ") + error.what();
  } catch (const TrainingError& error) {
    exit_code = 3;
    failure = std::string("training stopped: ") + error.what();
  } catch (const std::bad_alloc& error) {
    exit_code = 2;
    failure = "error: " + allocation_failure_message("", std::string("std::bad_alloc (") + error.what() + ")");
  } catch (const c10::Error& error) {  // c10::OutOfMemoryError and the CPU allocator's failures
    const std::string message = error.what_without_backtrace();
    exit_code = is_allocation_failure(message) ? 2 : 1;
    failure = exit_code == 2 ? "error: " + allocation_failure_message("", message) : std::string("fatal: ") + error.what();
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
