// A small MPI program that fails on purpose, for tests/mpi/rank_failure_test.sh.
//
// The failure we guard against is the silent hang: one rank stops while the others wait in a
// collective for it, forever. Two ways to stop, one per mode:
//   --mode user_error  the failing rank passes a bad argument (an all_gather output of the wrong
//                      size), gets llm::UserError before any communication, and ends through
//                      abort_world() as trainer's main() does; the message must name rank and host.
//   --mode sigkill     the failing rank kills itself with SIGKILL: no message of its own, mpirun
//                      must notice and end the others.
//   --mode none        nobody fails; the job must finish with status 0 (so the script can tell a
//                      probe that always fails from one that fails for the right reason).
// In every mode the healthy ranks enter the same all_gather.
//
//   mpirun -np 3 rank_failure_probe --mode user_error [--failing-rank 1]
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include <ATen/ATen.h>

#include "common/errors.h"
#include "sharding/communicator.h"
#include "sharding/world.h"

namespace {

struct Options {
  std::string mode = "none";
  int failing_rank = 1;
};

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw llm::UserError(flag + " needs a value");
    if (flag == "--mode") options.mode = argv[++i];
    else if (flag == "--failing-rank") options.failing_rank = std::stoi(argv[++i]);
    else throw llm::UserError("unknown flag " + flag + "; use --mode and --failing-rank");
  }
  if (options.mode != "none" && options.mode != "user_error" && options.mode != "sigkill")
    throw llm::UserError("--mode: '" + options.mode + "'; use none, user_error or sigkill");
  return options;
}

void run(const Options& options, const llm::World& world) {
  const std::unique_ptr<llm::Communicator> comm = llm::make_mpi_communicator(world);
  comm->barrier();  // every rank is up before anyone fails

  const int64_t count = 1024;
  const at::Tensor shard = at::full({count}, float(world.rank));
  int64_t gathered_count = world.world_size * count;
  if (world.rank == options.failing_rank) {
    if (options.mode == "sigkill") {
      std::printf("rank %d: probe kills itself with SIGKILL\n", world.rank);
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    if (options.mode == "user_error") gathered_count -= 1;  // bad input on this rank only
  }
  const at::Tensor gathered = at::empty({gathered_count});
  comm->all_gather(shard, gathered);
  if (world.rank == 0)
    std::printf("probe: all_gather finished on all %d ranks\n", world.world_size);
}

}  // namespace

int main(int argc, char** argv) {
  llm::World world = llm::start_world(&argc, &argv);
  return llm::run_reporting_failures(world, [&] {
    run(parse_options(argc, argv), world);
    return 0;
  });
}
