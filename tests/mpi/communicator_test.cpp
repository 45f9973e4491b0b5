// Every collective of every Communicator backend, in the manner of nccl-tests: inputs whose
// results are known exactly, and a count of wrong elements that must be zero.
//
// Inputs: element i of rank r is r * stride + i % stride, with the stride chosen per dtype and
// world size so that every value and every partial sum over ranks is an integer the dtype holds
// exactly (2^24 for float32, 2^8 for bfloat16). A sum therefore has one right answer whatever the
// reduction order, and any misplaced block, wrong rank order or lost rank shows up as wrong
// elements. Average is the one inexact case: it is compared within 4 units in the last place,
// because NCCL pre-multiplies each term by 1/n (rounding each product) where MPI divides the exact
// sum once.
//
// Sizes 1, 7, 22, 1023 hit vector tails and odd splits; 2^20 is large enough for MPI and NCCL to
// switch to their pipelined large-message algorithms. Backends: "single" (a world of one, each
// rank alone), "mpi" (CPU), "mpi_staged" (MPI through host staging buffers, over CPU tensors),
// "nccl" and "single_cuda" (skipped without a GPU per rank), "mpi_staged_cuda" (CUDA tensors staged
// through page-locked memory; ranks may share a GPU; skipped without one). The collectives run at
// whatever -np mpirun gives (ctest runs 1 to 4).
//
// Every rank must make the same collectives in the same order, so nothing that can differ between
// ranks may skip a collective: checks after a collective are EXPECT_*, never ASSERT_*.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <torch/cuda.h>
#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "common/errors.h"
#include "sharding/communicator.h"
#include "sharding/world.h"
#include "tests/mpi/backends.h"

namespace mpi_communicator_test {
namespace {

using llm::Communicator;
using llm::ReduceOp;

// --- predictable inputs ------------------------------------------------------------------------

// The largest integer up to which the dtype holds every integer exactly.
int64_t exact_integer_limit(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return int64_t{1} << 24;
    case at::kBFloat16: return int64_t{1} << 8;
    default: return int64_t{1} << 40;
  }
}

// Largest stride s with every sum over ranks below the limit: the biggest sum is
// s * (0 + 1 + ... + (n - 1)) + n * (s - 1) < s * n * (n + 1) / 2.
int64_t pattern_stride(at::ScalarType dtype, int world_size) {
  const int64_t bound = exact_integer_limit(dtype) / (int64_t{world_size} * (world_size + 1) / 2);
  return std::max<int64_t>(1, std::min<int64_t>(bound, int64_t{1} << 20));
}

// (count) int64: element j is the value of global index offset + j on rank `rank`.
at::Tensor pattern_values(int rank, int64_t offset, int64_t count, int64_t stride) {
  return at::arange(offset, offset + count, at::kLong).remainder(stride) + rank * stride;
}

at::Tensor pattern(const Communicator& comm, at::ScalarType dtype, int rank, int64_t offset,
                   int64_t count) {
  const int64_t stride = pattern_stride(dtype, comm.world_size());
  return pattern_values(rank, offset, count, stride).to(comm.device(), dtype);
}

// Exact sum over all ranks of the values at global indices [offset, offset + count), as double.
at::Tensor sum_over_ranks(const Communicator& comm, at::ScalarType dtype, int64_t offset,
                          int64_t count) {
  const int64_t stride = pattern_stride(dtype, comm.world_size());
  at::Tensor total = at::zeros({count}, at::kLong);
  for (int rank = 0; rank < comm.world_size(); ++rank)
    total += pattern_values(rank, offset, count, stride);
  return total.to(at::kDouble);
}

// Elements outside |actual - expected| <= relative * |expected| (NaN counts as wrong).
int64_t count_wrong(const at::Tensor& actual, const at::Tensor& expected, double relative = 0.0) {
  const at::Tensor got = actual.to(at::kCPU).to(at::kDouble).flatten();
  const at::Tensor allowed = expected.abs() * relative;
  return (got - expected).abs().le(allowed).logical_not().sum().item<int64_t>();
}

double average_tolerance(at::ScalarType dtype) {
  const double unit_roundoff = dtype == at::kBFloat16 ? 1.0 / 128 : 1.0 / (1 << 23);
  return 4 * unit_roundoff;
}

at::Tensor filled(const Communicator& comm, at::ScalarType dtype, int64_t count, double value) {
  return at::full({count}, value, at::TensorOptions().dtype(dtype).device(comm.device()));
}

// --- communicators, made once per backend and released before MPI_Finalize ----------------------

class Communicators : public ::testing::Environment {
 public:
  Communicators() { instance_ = this; }
  static Communicators& instance() { return *instance_; }

  // nullptr with a reason when this backend cannot run here.
  Communicator* get(const std::string& backend, std::string& why_not) {
    why_not = llm::testing::backend_unavailable_reason(backend);
    if (!why_not.empty()) return nullptr;
    auto found = made_.find(backend);
    if (found == made_.end()) found = made_.emplace(backend, llm::testing::make_backend(backend)).first;
    return found->second.get();
  }

  void TearDown() override { made_.clear(); }

 private:
  static inline Communicators* instance_ = nullptr;
  std::map<std::string, std::unique_ptr<Communicator>> made_;
};

::testing::Environment* const communicators_environment =
    ::testing::AddGlobalTestEnvironment(new Communicators);

// --- every collective, every dtype, every size --------------------------------------------------

using CollectiveCase = std::tuple<std::string, at::ScalarType, int64_t>;  // backend, dtype, count

class CollectiveTest : public ::testing::TestWithParam<CollectiveCase> {
 protected:
  void SetUp() override {
    std::string why_not;
    comm_ = Communicators::instance().get(std::get<0>(GetParam()), why_not);
    if (comm_ == nullptr) GTEST_SKIP() << why_not;
  }
  at::ScalarType dtype() const { return std::get<1>(GetParam()); }
  int64_t count() const { return std::get<2>(GetParam()); }
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->world_size(); }

  Communicator* comm_ = nullptr;
};

TEST_P(CollectiveTest, AllGatherIsRankMajor) {
  const at::Tensor input = pattern(*comm_, dtype(), rank(), 0, count());
  const at::Tensor output = filled(*comm_, dtype(), world_size() * count(), -1);
  comm_->all_gather(input, output);
  at::Tensor expected = at::empty({world_size() * count()}, at::kDouble);
  const int64_t stride = pattern_stride(dtype(), world_size());
  for (int from = 0; from < world_size(); ++from)
    expected.narrow(0, from * count(), count()).copy_(pattern_values(from, 0, count(), stride));
  EXPECT_EQ(count_wrong(output, expected), 0) << "all_gather of " << count() << " elements";
  EXPECT_EQ(count_wrong(input, pattern_values(rank(), 0, count(), stride).to(at::kDouble)), 0)
      << "all_gather changed its input";
}

TEST_P(CollectiveTest, AllGatherInPlace) {
  const at::Tensor output = filled(*comm_, dtype(), world_size() * count(), -1);
  const at::Tensor own_slice = output.narrow(0, rank() * count(), count());
  own_slice.copy_(pattern(*comm_, dtype(), rank(), 0, count()));
  comm_->all_gather(own_slice, output);
  at::Tensor expected = at::empty({world_size() * count()}, at::kDouble);
  const int64_t stride = pattern_stride(dtype(), world_size());
  for (int from = 0; from < world_size(); ++from)
    expected.narrow(0, from * count(), count()).copy_(pattern_values(from, 0, count(), stride));
  EXPECT_EQ(count_wrong(output, expected), 0) << "in-place all_gather of " << count();
}

TEST_P(CollectiveTest, ReduceScatterSum) {
  const at::Tensor input = pattern(*comm_, dtype(), rank(), 0, world_size() * count());
  const at::Tensor output = filled(*comm_, dtype(), count(), -1);
  comm_->reduce_scatter(input, output, ReduceOp::sum);
  const at::Tensor expected = sum_over_ranks(*comm_, dtype(), rank() * count(), count());
  EXPECT_EQ(count_wrong(output, expected), 0) << "reduce_scatter sum of " << count();
}

TEST_P(CollectiveTest, ReduceScatterAverage) {
  const at::Tensor input = pattern(*comm_, dtype(), rank(), 0, world_size() * count());
  const at::Tensor output = filled(*comm_, dtype(), count(), -1);
  if (dtype() == at::kLong) {
    EXPECT_THROW(comm_->reduce_scatter(input, output, ReduceOp::average), llm::UserError);
    return;
  }
  comm_->reduce_scatter(input, output, ReduceOp::average);
  const at::Tensor expected =
      sum_over_ranks(*comm_, dtype(), rank() * count(), count()) / world_size();
  EXPECT_EQ(count_wrong(output, expected, average_tolerance(dtype())), 0)
      << "reduce_scatter average of " << count();
}

TEST_P(CollectiveTest, AllReduceSum) {
  const at::Tensor tensor = pattern(*comm_, dtype(), rank(), 0, count());
  comm_->all_reduce(tensor, ReduceOp::sum);
  EXPECT_EQ(count_wrong(tensor, sum_over_ranks(*comm_, dtype(), 0, count())), 0)
      << "all_reduce sum of " << count();
}

TEST_P(CollectiveTest, AllReduceAverage) {
  const at::Tensor tensor = pattern(*comm_, dtype(), rank(), 0, count());
  if (dtype() == at::kLong) {
    EXPECT_THROW(comm_->all_reduce(tensor, ReduceOp::average), llm::UserError);
    return;
  }
  comm_->all_reduce(tensor, ReduceOp::average);
  const at::Tensor expected = sum_over_ranks(*comm_, dtype(), 0, count()) / world_size();
  EXPECT_EQ(count_wrong(tensor, expected, average_tolerance(dtype())), 0)
      << "all_reduce average of " << count();
}

TEST_P(CollectiveTest, BroadcastFromEveryRoot) {
  const int64_t stride = pattern_stride(dtype(), world_size());
  for (int root = 0; root < world_size(); ++root) {
    const at::Tensor tensor = rank() == root ? pattern(*comm_, dtype(), root, 0, count())
                                             : filled(*comm_, dtype(), count(), -1);
    comm_->broadcast(tensor, root);
    EXPECT_EQ(count_wrong(tensor, pattern_values(root, 0, count(), stride).to(at::kDouble)), 0)
        << "broadcast of " << count() << " from root " << root;
  }
}

std::string case_name(const ::testing::TestParamInfo<CollectiveCase>& info) {
  const auto& [backend, dtype, count] = info.param;
  return backend + "_" + c10::toString(dtype) + "_" + std::to_string(count);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, CollectiveTest,
    ::testing::Combine(::testing::Values("single", "mpi", "mpi_staged", "nccl", "single_cuda", "mpi_staged_cuda"),
                       ::testing::Values(at::kFloat, at::kBFloat16, at::kLong),
                       ::testing::Values(1, 7, 22, 1023, int64_t{1} << 20)),
    case_name);

// --- argument errors: thrown on every rank alike, before any communication ----------------------

class ArgumentErrorTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why_not;
    comm_ = Communicators::instance().get(GetParam(), why_not);
    if (comm_ == nullptr) GTEST_SKIP() << why_not;
  }
  at::Tensor floats(int64_t count) const { return filled(*comm_, at::kFloat, count, 1); }

  Communicator* comm_ = nullptr;
};

// The message must name the collective, the backend and the offending argument.
#define EXPECT_USER_ERROR(statement, fragment)                                                 \
  do {                                                                                         \
    try {                                                                                      \
      statement;                                                                               \
      ADD_FAILURE() << #statement << " did not throw";                                         \
    } catch (const llm::UserError& error) {                                                    \
      const std::string message = error.what();                                                \
      EXPECT_NE(message.find(fragment), std::string::npos) << message;                         \
      EXPECT_NE(message.find(comm_->backend_name() + " communicator"), std::string::npos)      \
          << message;                                                                          \
    }                                                                                          \
  } while (0)

TEST_P(ArgumentErrorTest, SizeMismatches) {
  const int n = comm_->world_size();
  EXPECT_USER_ERROR(comm_->all_gather(floats(4), floats(4 * n + 1)), "all_gather");
  EXPECT_USER_ERROR(comm_->all_gather(floats(4), floats(4 * n + 1)), "world_size");
  EXPECT_USER_ERROR(comm_->reduce_scatter(floats(4 * n - 1), floats(4), ReduceOp::sum),
                    "reduce_scatter");
  EXPECT_USER_ERROR(comm_->reduce_scatter(floats(4 * n + 4), floats(4), ReduceOp::sum), "input");
}

TEST_P(ArgumentErrorTest, NonContiguous) {
  const at::Tensor matrix = floats(6).view({2, 3});
  const at::Tensor transposed = matrix.t();
  EXPECT_USER_ERROR(comm_->all_reduce(transposed, ReduceOp::sum), "not contiguous");
  EXPECT_USER_ERROR(comm_->broadcast(floats(8).slice(0, 0, 8, 2), 0), "not contiguous");
}

TEST_P(ArgumentErrorTest, DtypeMismatchesAndUnsupportedDtypes) {
  const int n = comm_->world_size();
  const at::Tensor bf16_output = filled(*comm_, at::kBFloat16, 4 * n, 0);
  EXPECT_USER_ERROR(comm_->all_gather(floats(4), bf16_output), "differs from the input");
  const at::Tensor doubles = filled(*comm_, at::kDouble, 4, 0);
  EXPECT_USER_ERROR(comm_->all_reduce(doubles, ReduceOp::sum), "not supported");
  const at::Tensor counters = filled(*comm_, at::kLong, 4, 0);
  EXPECT_USER_ERROR(comm_->all_reduce(counters, ReduceOp::average), "average");
}

TEST_P(ArgumentErrorTest, WrongDevice) {
  // A meta tensor is on no device this communicator works on, and needs no GPU to make.
  const at::Tensor elsewhere = at::empty({4}, at::TensorOptions().device(c10::kMeta));
  EXPECT_USER_ERROR(comm_->all_reduce(elsewhere, ReduceOp::sum), "meta");
  if (!comm_->device().is_cuda()) {
    const c10::Stream cpu_stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
    EXPECT_USER_ERROR(comm_->all_reduce(floats(4), ReduceOp::sum, cpu_stream), "stream");
  }
}

TEST_P(ArgumentErrorTest, BadRootAndOverlaps) {
  const int n = comm_->world_size();
  EXPECT_USER_ERROR(comm_->broadcast(floats(4), -1), "root");
  EXPECT_USER_ERROR(comm_->broadcast(floats(4), n), "root");
  const at::Tensor buffer = floats(4 * n);
  EXPECT_USER_ERROR(comm_->reduce_scatter(buffer, buffer.narrow(0, 0, 4), ReduceOp::sum),
                    "overlaps");
  if (n > 1) {  // a slice that is not this rank's own
    const at::Tensor gathered = floats(4 * n);
    const int other = (comm_->rank() + 1) % n;
    EXPECT_USER_ERROR(comm_->all_gather(gathered.narrow(0, 4 * other, 4), gathered), "overlaps");
  }
}

TEST_P(ArgumentErrorTest, ErrorsLeaveTheCommunicatorUsable) {
  EXPECT_THROW(comm_->all_reduce(floats(4).view({2, 2}).t(), ReduceOp::sum), llm::UserError);
  const at::Tensor ones = floats(3);
  comm_->all_reduce(ones, ReduceOp::sum);
  EXPECT_EQ(count_wrong(ones, at::full({3}, double(comm_->world_size()), at::kDouble)), 0);
  comm_->barrier();
}

INSTANTIATE_TEST_SUITE_P(Backends, ArgumentErrorTest,
                         ::testing::Values("single", "mpi", "mpi_staged", "nccl", "single_cuda", "mpi_staged_cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// --- the factory ---------------------------------------------------------------------------------

// --- split: hybrid sharding's groups and the replicas across them ---------------------------------

class SplitTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why_not;
    comm_ = Communicators::instance().get(GetParam(), why_not);
    if (comm_ == nullptr) GTEST_SKIP() << why_not;
  }
  Communicator* comm_ = nullptr;
};

// Groups of consecutive ranks (color rank / 2) and the ranks across them (color rank % 2, ordered by
// the key): each its members in key order, a sum over exactly them, its bytes counted by the ring
// formula; a rank alone in its group gets a communicator of one.
TEST_P(SplitTest, GroupsAndAcrossSumOverTheirMembersOnly) {
  const int rank = comm_->rank(), world = comm_->world_size();
  for (const bool consecutive : {true, false}) {
    SCOPED_TRACE(consecutive ? "groups of consecutive ranks" : "across the groups");
    const int color = consecutive ? rank / 2 : rank % 2;
    const std::unique_ptr<Communicator> part = comm_->split(color, consecutive ? rank : world - rank);
    ASSERT_NE(part, nullptr);
    std::vector<int> members;
    for (int r = 0; r < world; ++r)
      if ((consecutive ? r / 2 : r % 2) == color) members.push_back(r);
    if (!consecutive) std::reverse(members.begin(), members.end());  // key world - rank: descending
    EXPECT_EQ(part->world_size(), static_cast<int>(members.size()));
    EXPECT_EQ(part->world_ranks(), members);
    ASSERT_LT(part->rank(), part->world_size());
    EXPECT_EQ(members[static_cast<size_t>(part->rank())], rank);
    EXPECT_EQ(part->device(), comm_->device());

    part->set_label("part");
    const at::Tensor values = filled(*comm_, at::kFloat, 1000, static_cast<double>(1 << rank));
    part->all_reduce(values, ReduceOp::sum);
    double expected = 0;
    for (int member : members) expected += static_cast<double>(1 << member);
    EXPECT_EQ(values.to(at::kCPU).max().item<double>(), expected);
    EXPECT_EQ(values.to(at::kCPU).min().item<double>(), expected);
    const llm::LinkTraffic traffic = part->take_traffic();
    const int size = part->world_size();
    EXPECT_EQ(traffic.bytes_sent, 2 * (size - 1) * 4000 / size);
    EXPECT_EQ(traffic.collectives, 1);
    EXPECT_EQ(part->take_traffic().collectives, 0) << "taken: counted anew";
  }
  EXPECT_THROW(comm_->split(-1, 0), llm::UserError);
}

INSTANTIATE_TEST_SUITE_P(Backends, SplitTest,
                         ::testing::Values("single", "mpi", "mpi_staged", "nccl", "single_cuda", "mpi_staged_cuda"),
                         [](const auto& info) { return info.param; });

TEST(MakeCommunicator, PicksTheBackendFromWorldAndDevice) {
  const llm::World& world = llm::current_world();
  const std::unique_ptr<Communicator> comm = llm::make_communicator(world, c10::kCPU);
  EXPECT_EQ(comm->backend_name(), world.world_size == 1 ? "single" : "mpi");
  EXPECT_EQ(comm->rank(), world.rank);
  EXPECT_EQ(comm->world_size(), world.world_size);
  comm->barrier();
  // --communicator mpi on CPU ranks is the MPI backend; LLM_DEBUG_STAGE_MPI=1 stages it through host
  // buffers, so the trainer's CPU tests can run the staging a GPU rank uses.
  if (world.world_size > 1) {
    EXPECT_EQ(llm::make_communicator(world, c10::kCPU, /*prefer_mpi=*/true)->backend_name(), "mpi");
    setenv("LLM_DEBUG_STAGE_MPI", "1", 1);
    EXPECT_EQ(llm::make_communicator(world, c10::kCPU, /*prefer_mpi=*/true)->backend_name(),
              "mpi (staged through host memory)");
    EXPECT_EQ(llm::make_communicator(world, c10::kCPU)->backend_name(), "mpi") << "only when asked for";
    unsetenv("LLM_DEBUG_STAGE_MPI");
  }
}

TEST(MakeCommunicator, RejectsDevicesItCannotServe) {
  const llm::World& world = llm::current_world();
  // "cuda" without an index: rejected in every build, on every rank, before any communication.
  EXPECT_THROW(llm::make_communicator(world, c10::Device(c10::kCUDA)), llm::UserError);
  EXPECT_THROW(llm::make_communicator(world, c10::Device(c10::kMeta)), llm::UserError);
}

#ifdef TRAINER_HAVE_CUDA
// The NCCL backend on a stream of the caller's choosing: the result must be there once that
// stream has finished, and the current stream must not have been used.
TEST(NcclStreams, CollectivesRunOnTheGivenStream) {
  std::string why_not;
  Communicator* comm = Communicators::instance().get("nccl", why_not);
  if (comm == nullptr) GTEST_SKIP() << why_not;
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, comm->device().index());
  const int64_t count = 4099;
  const at::Tensor tensor = pattern(*comm, at::kFloat, comm->rank(), 0, count);
  c10::cuda::getCurrentCUDAStream(comm->device().index()).synchronize();  // tensor is ready
  comm->all_reduce(tensor, ReduceOp::sum, side);
  const at::Tensor input = pattern(*comm, at::kFloat, comm->rank(), 0, count);
  const at::Tensor gathered = filled(*comm, at::kFloat, comm->world_size() * count, -1);
  c10::cuda::getCurrentCUDAStream(comm->device().index()).synchronize();
  comm->all_gather(input, gathered, side);
  side.synchronize();
  EXPECT_EQ(count_wrong(tensor, sum_over_ranks(*comm, at::kFloat, 0, count)), 0);
  EXPECT_EQ(count_wrong(gathered.narrow(0, comm->rank() * count, count),
                        pattern_values(comm->rank(), 0, count,
                                       pattern_stride(at::kFloat, comm->world_size()))
                            .to(at::kDouble)),
            0);
}
#endif

}  // namespace
}  // namespace mpi_communicator_test
