// main() of the multi-rank test binary `mpi_tests`, run as `mpirun -np N mpi_tests`.
//
// Every rank runs every test (the tests make the same collectives in the same order), but a
// person should read one gtest report, not N interleaved ones: rank 0 keeps GoogleTest's printer,
// the other ranks print only their failures, each line prefixed with rank and host. A failure on
// any rank fails the job: the ranks agree on the outcome with an all-reduce and all exit non-zero,
// and rank 0 names the ranks that failed. A rank that dies or hangs is mpirun's and ctest's
// business (the job ends, or times out).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "common/log.h"
#include "sharding/world.h"

namespace {

// Prints each failed assertion as "[rank R on HOST] FAILED Suite.Test at file:line: message".
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  RankFailurePrinter(int rank, std::string host) : rank_(rank), host_(std::move(host)) {}

  // The test's name is kept here: UnitTest::current_test_info() would take the lock that
  // GoogleTest holds while it reports a part result, and deadlock.
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_name_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestEnd(const ::testing::TestInfo&) override { test_name_ = "(outside a test)"; }

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stdout, "[rank %d on %s] FAILED %s at %s:%d:\n%s\n", rank_, host_.c_str(),
                 test_name_.c_str(), result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
    std::fflush(stdout);
  }

 private:
  int rank_;
  std::string host_;
  std::string test_name_ = "(outside a test)";
};

}  // namespace

int main(int argc, char** argv) {
  const llm::World world = llm::start_world(&argc, &argv);
  llm::log::configure(world.rank, world.world_size);
  ::testing::InitGoogleTest(&argc, argv);

  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (world.rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    delete listeners.Release(listeners.default_xml_generator());  // rank 0 writes --gtest_output's file alone
    listeners.Append(new RankFailurePrinter(world.rank, world.host));
  }

  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;

  // Which ranks failed, on every rank (so every rank's exit code reflects every rank's failures).
  std::vector<int> failed_by_rank(static_cast<size_t>(world.world_size), 0);
  LLM_CHECK_MPI(MPI_Allgather(&local_failed, 1, MPI_INT, failed_by_rank.data(), 1, MPI_INT,
                              MPI_COMM_WORLD));
  std::string failed_ranks;
  for (int rank = 0; rank < world.world_size; ++rank)
    if (failed_by_rank[static_cast<size_t>(rank)])
      failed_ranks += (failed_ranks.empty() ? "" : ", ") + std::to_string(rank);
  if (world.rank == 0) {
    if (failed_ranks.empty())
      std::printf("mpi_tests: all tests passed on all %d rank(s)\n", world.world_size);
    else
      std::printf("mpi_tests: FAILED on rank(s) %s of %d (their failures are printed above)\n",
                  failed_ranks.c_str(), world.world_size);
    std::fflush(stdout);
  }
  llm::stop_world();
  return failed_ranks.empty() ? 0 : 1;
}
