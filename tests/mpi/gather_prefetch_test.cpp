// ShardedUnit::gather_async (the prefetch) against gather(), at whatever -np mpirun gives.
//
// Backends "single" and "mpi" are CPU: there is no gather stream, and gather_async must be gather()
// exactly (the training loop relies on that for --no_prefetch equivalence on CPU). Backends "nccl"
// and "single_cuda" run the real thing: the all-gather and copies on a side stream behind an event
// of the compute stream, and the compute stream waiting on the "gathered" event; they skip without
// a GPU per rank (and in a build without CUDA).
//
// Every parameter's full values are a known function of (unit seed, index), so each gathered
// parameter has one right answer and the comparisons are exact: gathers only copy. Shapes have row
// counts 1, 7, 22 and 1023 so that row padding to a multiple of the world size is exercised.
//
// Every rank makes the same collectives in the same order: checks are EXPECT_*, never ASSERT_*,
// once a collective has been made.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/cuda.h>
#ifdef TRAINER_HAVE_CUDA
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "sharding/communicator.h"
#include "sharding/fsdp_unit.h"
#include "sharding/world.h"
#include "tests/mpi/backends.h"

namespace mpi_gather_prefetch_test {
namespace {

using llm::Communicator;
using llm::ShardedUnit;
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The full (unsharded) fp32 values of a unit's parameters, identical on every rank.
NamedTensors full_parameters(int64_t seed, c10::Device device) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"one_row", {1, 4}}, {"seven_rows", {7, 5}}, {"gain", {22}}, {"tall", {1023, 3}}};
  NamedTensors parameters;
  int64_t offset = seed * 100000;
  for (const auto& [name, shape] : shapes) {
    int64_t numel = 1;
    for (int64_t size : shape) numel *= size;
    // Integers below 2^24: exact in fp32, and different for every element and every seed.
    parameters.emplace_back(name, at::arange(offset, offset + numel, at::kFloat).view(shape).to(device));
    offset += numel;
  }
  return parameters;
}

// A unit built from copies of the full values, and handles to its module parameters: ShardedUnit
// frees and re-allocates their storage in place, so the handles read what the unit gathered.
struct TestUnit {
  NamedTensors parameters;
  std::unique_ptr<ShardedUnit> unit;

  at::Tensor parameter(size_t index) const { return parameters.at(index).second; }
};

TestUnit make_unit(Communicator& comm, const NamedTensors& full) {
  TestUnit made;
  for (const auto& [name, tensor] : full) made.parameters.emplace_back(name, tensor.clone());
  made.unit = std::make_unique<ShardedUnit>("unit", made.parameters, comm,
                                            llm::ShardingStrategy::full_shard, at::kFloat);
  return made;
}

class GatherPrefetch : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string why_not = llm::testing::backend_unavailable_reason(GetParam());
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    comm_ = llm::testing::make_backend(GetParam());
    stream_ = llm::make_gather_stream(comm_->device());
  }
  bool on_gpu() const { return comm_->device().is_cuda(); }

  std::unique_ptr<Communicator> comm_;
  llm::CollectiveStream stream_;
};

TEST_P(GatherPrefetch, GatherStreamExistsExactlyOnCuda) {
  EXPECT_EQ(stream_.has_value(), on_gpu());
  EXPECT_FALSE(llm::make_gather_stream(c10::kCPU).has_value());
}

TEST_P(GatherPrefetch, AsyncGatherEqualsSynchronousGather) {
  const NamedTensors full = full_parameters(/*seed=*/1, comm_->device());
  TestUnit synchronous = make_unit(*comm_, full);
  TestUnit prefetched = make_unit(*comm_, full);
  EXPECT_FALSE(prefetched.unit->gathered());
  EXPECT_EQ(prefetched.unit->compute_parameter_bytes(), 0);

  synchronous.unit->gather();
  prefetched.unit->gather_async(stream_);
  // The storage exists from the moment the prefetch is issued (that is what the bound counts).
  EXPECT_TRUE(prefetched.unit->gathered());
  EXPECT_EQ(prefetched.unit->compute_parameter_bytes(), synchronous.unit->compute_parameter_bytes());
  EXPECT_EQ(prefetched.unit->gather_in_flight(), on_gpu()) << "CPU gathers in line";
  prefetched.unit->wait_gathered();
  EXPECT_FALSE(prefetched.unit->gather_in_flight());

  // Read on the compute stream after wait_gathered, as the unit's forward would.
  for (size_t i = 0; i < full.size(); ++i) {
    const at::Tensor read = prefetched.parameter(i).clone().cpu();
    EXPECT_TRUE(at::equal(read, synchronous.parameter(i).cpu())) << full[i].first;
    EXPECT_TRUE(at::equal(read, full[i].second.cpu())) << full[i].first;
  }
  synchronous.unit->release();
  prefetched.unit->release();
  EXPECT_EQ(prefetched.unit->compute_parameter_bytes(), 0);
}

// What the training loop does between two units: A runs, A is released, B's prefetch starts. B's
// storage may be A's freed blocks (same sizes, same stream), so the gather stream must not write
// them before the compute stream has read A. On a GPU a long kernel queued ahead of A's reader
// makes a gather that skipped the compute-stream event overwrite A before it is read; on CPU the
// order is the program order and this only checks the bookkeeping.
TEST_P(GatherPrefetch, PrefetchIntoReleasedStorageWaitsForItsLastReader) {
  const NamedTensors full_a = full_parameters(/*seed=*/2, comm_->device());
  const NamedTensors full_b = full_parameters(/*seed=*/3, comm_->device());
  TestUnit a = make_unit(*comm_, full_a);
  TestUnit b = make_unit(*comm_, full_b);
  for (int round = 0; round < 3; ++round) {
    std::vector<at::Tensor> read_a, read_b;
    a.unit->gather_async(stream_);
    a.unit->wait_gathered();
#ifdef TRAINER_HAVE_CUDA
    if (on_gpu()) at::cuda::sleep(int64_t{50} * 1000 * 1000);  // tens of ms on the compute stream
#endif
    for (size_t i = 0; i < full_a.size(); ++i) read_a.push_back(a.parameter(i) * 2);
    a.unit->release();
    b.unit->gather_async(stream_);
    b.unit->wait_gathered();
    for (size_t i = 0; i < full_b.size(); ++i) read_b.push_back(b.parameter(i).clone());
    b.unit->release();
    for (size_t i = 0; i < full_a.size(); ++i) {
      EXPECT_TRUE(at::equal(read_a[i].cpu(), full_a[i].second.cpu() * 2)) << "round " << round << ", A " << full_a[i].first;
      EXPECT_TRUE(at::equal(read_b[i].cpu(), full_b[i].second.cpu())) << "round " << round << ", B " << full_b[i].first;
    }
  }
}

TEST_P(GatherPrefetch, RepeatedCallsAreHarmless) {
  const NamedTensors full = full_parameters(/*seed=*/4, comm_->device());
  TestUnit made = make_unit(*comm_, full);
  ShardedUnit& unit = *made.unit;
  unit.wait_gathered();          // nothing in flight: nothing to do
  unit.gather_async(stream_);
  unit.gather_async(stream_);    // already gathered: no second collective
  unit.gather();                 // waits for the prefetch instead of gathering again
  EXPECT_FALSE(unit.gather_in_flight());
  EXPECT_TRUE(at::equal(made.parameter(1).cpu(), full[1].second.cpu()));
  unit.release();
  unit.release();
  EXPECT_FALSE(unit.gathered());
  unit.gather_async(stream_);
  unit.release();                // a prefetch released unused
  EXPECT_FALSE(unit.gathered());
  EXPECT_FALSE(unit.gather_in_flight());
}

INSTANTIATE_TEST_SUITE_P(Backends, GatherPrefetch,
                         ::testing::Values("single", "mpi", "nccl", "single_cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace mpi_gather_prefetch_test
