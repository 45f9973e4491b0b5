#include "optim/host_threads.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace llm {
namespace {

int online_cpus() {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

// A positive integer from the environment, or 0.
int positive_from_environment(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  // SLURM_NTASKS_PER_NODE may read "2(x3)" on heterogeneous jobs: the leading count is this node's
  // shape often enough, and anything unreadable falls through to the next variable.
  if (end == text || value <= 0 || value > 1 << 20) return 0;
  return static_cast<int>(value);
}

}  // namespace

int cores_available() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
    const int count = CPU_COUNT(&mask);
    if (count > 0) return count;
  }
  return online_cpus();
}

int local_ranks_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                           "LOCAL_WORLD_SIZE"}) {
    if (const int value = positive_from_environment(name); value > 0) return value;
  }
  return 1;
}

int default_host_step_threads(int local_ranks) {
  const int64_t cores = cores_available();
  const int64_t online = std::max<int64_t>(online_cpus(), cores);
  const int64_t ranks = local_ranks > 0 ? local_ranks : local_ranks_from_environment();
  const int64_t sharing_my_cores = std::max<int64_t>(1, (ranks * cores + online - 1) / online);
  return static_cast<int>(std::max<int64_t>(1, cores / sharing_my_cores));
}

}  // namespace llm
