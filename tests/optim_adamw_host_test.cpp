// The host AdamW kernels (optim/adamw_host.h) against the scalar element functor, bit for bit:
//  * every kernel this CPU runs (scalar, AVX2, AVX-512; the ones it lacks are skipped and named),
//    called directly through adamw_host_range, on sizes around every vector width (1, 7, 15, 16,
//    17, 1023, 100003), fp32 and bf16 gradients, both of torch's lerp forms (beta1 0.9 and 0.3),
//    with and without weight decay, at aligned and misaligned addresses;
//  * the threaded entry point adamw_update_host at 1, 2 and 3 threads;
//  * the bf16 compute copy against master.to(kBFloat16) (and c10::BFloat16 for NaN, ties, overflow);
//  * the thread-count helper of optim/host_threads.h.
// Bitwise, not within a tolerance: the kernels do the functor's operations in its order with IEEE
// division and square root and no FMA, so any difference is a bug (a contracted multiply-add, a
// reordered sum, a tail that skipped an element).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "optim/adamw.h"
#include "optim/adamw_functor.h"
#include "optim/adamw_host.h"
#include "optim/host_threads.h"
#include "tests/tensor_checks.h"

namespace optim_adamw_host_test {
namespace {

using llm::HostIsa;
using llm::testing::expect_same_bits;

const std::vector<int64_t> kSizes = {1, 7, 15, 16, 17, 1023, 100003};
constexpr int kSteps = 3;

struct Case {
  bool bf16_grad;
  double beta1;
  double weight_decay;
};

std::string describe(const Case& c, int64_t numel, int64_t offset) {
  return std::string(c.bf16_grad ? "bf16" : "fp32") + " grad, beta1 " + std::to_string(c.beta1) +
         ", wd " + std::to_string(c.weight_decay) + ", numel " + std::to_string(numel) +
         ", offset " + std::to_string(offset);
}

// The state of one update, with room for a misaligned start: element 0 of each array sits
// `offset` floats into its allocation.
struct State {
  at::Tensor param, grad, exp_avg, exp_avg_sq, compute;  // views at `offset`
  State(int64_t numel, int64_t offset, bool bf16_grad, uint64_t seed) {
    at::manual_seed(seed);
    const auto view = [&](const at::Tensor& whole) { return whole.narrow(0, offset, numel); };
    param = view(at::randn({numel + offset}));
    const at::Tensor g = at::randn({numel + offset});
    grad = view(bf16_grad ? g.to(at::kBFloat16) : g);
    exp_avg = view(at::randn({numel + offset}) * 0.1);
    exp_avg_sq = view(at::rand({numel + offset}) * 0.01);
    compute = view(at::zeros({numel + offset}, at::kBFloat16));
  }
  State clone() const {
    State copy = *this;
    for (at::Tensor* t : {&copy.param, &copy.grad, &copy.exp_avg, &copy.exp_avg_sq, &copy.compute})
      *t = t->clone();
    return copy;
  }
  llm::AdamWHostArrays arrays(bool write_compute) {
    return {param.data_ptr<float>(), grad.const_data_ptr(), grad.scalar_type() == at::kBFloat16,
            exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(),
            write_compute ? reinterpret_cast<uint16_t*>(compute.data_ptr<at::BFloat16>()) : nullptr};
  }
};

// The reference: the element functor in a plain loop.
template <typename GradElement, bool kLerpFromStart>
void functor_loop(State& s, const llm::AdamWScalars& scalars) {
  const llm::AdamWElementUpdate<GradElement, kLerpFromStart> update{
      s.param.data_ptr<float>(), static_cast<const GradElement*>(s.grad.const_data_ptr()),
      s.exp_avg.data_ptr<float>(), s.exp_avg_sq.data_ptr<float>(), scalars};
  for (int64_t i = 0; i < s.param.numel(); ++i) update(i);
}

void reference_step(State& s, const llm::AdamWScalars& scalars) {
  const bool bf16 = s.grad.scalar_type() == at::kBFloat16;
  if (bf16 && scalars.exp_avg_lerp_from_start) functor_loop<c10::BFloat16, true>(s, scalars);
  if (bf16 && !scalars.exp_avg_lerp_from_start) functor_loop<c10::BFloat16, false>(s, scalars);
  if (!bf16 && scalars.exp_avg_lerp_from_start) functor_loop<float, true>(s, scalars);
  if (!bf16 && !scalars.exp_avg_lerp_from_start) functor_loop<float, false>(s, scalars);
}

llm::AdamWScalars scalars_of(const Case& c, int step) {
  return llm::make_adamw_scalars(1e-3 * (1 + step), c.beta1, 0.999, 1e-8, c.weight_decay, step);
}

// Every array of an update after the steps: master, both moments, the bf16 copy.
void expect_same_state(const State& actual, const State& expected_state, const at::Tensor& expected_compute) {
  expect_same_bits(actual.param, expected_state.param, "param");
  expect_same_bits(actual.exp_avg, expected_state.exp_avg, "exp_avg");
  expect_same_bits(actual.exp_avg_sq, expected_state.exp_avg_sq, "exp_avg_sq");
  expect_same_bits(actual.compute, expected_compute, "bf16 compute copy");
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (bool bf16 : {false, true})
    for (double beta1 : {0.9, 0.3})
      for (double weight_decay : {0.0, 0.1}) cases.push_back({bf16, beta1, weight_decay});
  return cases;
}

class EveryKernel : public ::testing::TestWithParam<HostIsa> {};

// Each kernel, called directly over the whole range, three steps, against the functor loop; the
// compute copy against the updated master.to(kBFloat16).
TEST_P(EveryKernel, EqualsTheScalarFunctorBitwise) {
  const HostIsa isa = GetParam();
  if (!llm::host_isa_supported(isa))
    GTEST_SKIP() << "this CPU (or build) has no " << llm::to_string(isa) << " kernel";
  for (const Case& c : all_cases())
    for (int64_t numel : kSizes)
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE(std::string(llm::to_string(isa)) + ", " + describe(c, numel, offset));
        State expected(numel, offset, c.bf16_grad, 42 + numel);
        State actual = expected.clone();
        for (int step = 1; step <= kSteps; ++step) {
          const llm::AdamWScalars scalars = scalars_of(c, step);
          reference_step(expected, scalars);
          // Write the compute copy on the last step only: the path without it is checked too.
          llm::adamw_host_range(isa, actual.arrays(/*write_compute=*/step == kSteps), scalars, 0,
                                numel);
        }
        expect_same_state(actual, expected, expected.param.to(at::kBFloat16));
      }
}

// A range that starts off a vector boundary (a thread's block, an offload chunk) changes nothing.
TEST_P(EveryKernel, PartialRangesEqualOneRange) {
  const HostIsa isa = GetParam();
  if (!llm::host_isa_supported(isa))
    GTEST_SKIP() << "this CPU (or build) has no " << llm::to_string(isa) << " kernel";
  const Case c{/*bf16_grad=*/true, 0.9, 0.1};
  State whole(1023, 0, c.bf16_grad, 5);
  State pieces = whole.clone();
  const llm::AdamWScalars scalars = scalars_of(c, 1);
  llm::adamw_host_range(isa, whole.arrays(true), scalars, 0, 1023);
  for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 3}, {3, 20}, {20, 517}, {517, 1023}})
    llm::adamw_host_range(isa, pieces.arrays(true), scalars, begin, end);
  expect_same_state(pieces, whole, whole.compute);
}

// The clip coefficient folded in (AdamWScalars::gradient_scale): each kernel's one pass gives the
// bits of grad.mul_(scale) on the fp32 gradient and then the unscaled step, at coefficients that
// round (0.37...), that are powers of two, and at 1 and 0.
TEST_P(EveryKernel, TheFoldedClipEqualsScalingTheGradientFirst) {
  const HostIsa isa = GetParam();
  if (!llm::host_isa_supported(isa))
    GTEST_SKIP() << "this CPU (or build) has no " << llm::to_string(isa) << " kernel";
  for (double scale : {0.3713924061, 0.5, 1.0, 0.0, 1e-3})
    for (int64_t numel : kSizes) {
      SCOPED_TRACE(std::string(llm::to_string(isa)) + ", scale " + std::to_string(scale) + ", " + std::to_string(numel));
      const Case c{/*bf16_grad=*/false, 0.9, 0.1};
      State expected(numel, 1, c.bf16_grad, 7 + numel);
      State folded = expected.clone();
      expected.grad.mul_(scale);
      llm::adamw_host_range(isa, expected.arrays(true), scalars_of(c, 2), 0, numel);
      llm::AdamWScalars scaled = scalars_of(c, 2);
      scaled.gradient_scale = static_cast<float>(scale);  // as make_adamw_scalars rounds it
      llm::adamw_host_range(isa, folded.arrays(true), scaled, 0, numel);
      expect_same_state(folded, expected, expected.compute);
    }
}

// Out of place (offload's speculative step, optim/adamw_host.h's *_from): each kernel reads the
// master and moments from one set and writes another, the bits of stepping a copy in place, and the
// set it read keeps its values. Misaligned, vector tails, with and without the compute copy.
TEST_P(EveryKernel, OutOfPlaceEqualsSteppingACopyInPlace) {
  const HostIsa isa = GetParam();
  if (!llm::host_isa_supported(isa))
    GTEST_SKIP() << "this CPU (or build) has no " << llm::to_string(isa) << " kernel";
  for (const Case& c : all_cases())
    for (int64_t numel : kSizes) {
      SCOPED_TRACE(std::string(llm::to_string(isa)) + ", " + describe(c, numel, 1));
      const State before(numel, 1, c.bf16_grad, 11 + numel);
      State in_place = before.clone();
      llm::adamw_host_range(isa, in_place.arrays(true), scalars_of(c, 2), 0, numel);
      const State kept = before.clone();
      State out = before.clone();
      for (at::Tensor* t : {&out.param, &out.exp_avg, &out.exp_avg_sq}) t->fill_(std::nanf(""));  // poisoned
      llm::AdamWHostArrays arrays = out.arrays(true);
      arrays.grad = before.grad.const_data_ptr();
      arrays.param_from = before.param.const_data_ptr<float>();
      arrays.exp_avg_from = before.exp_avg.const_data_ptr();
      arrays.exp_avg_sq_from = before.exp_avg_sq.const_data_ptr();
      llm::adamw_host_range(isa, arrays, scalars_of(c, 2), 0, numel);
      expect_same_state(out, in_place, in_place.compute);
      expect_same_state(before, kept, kept.compute);  // the sources are unchanged
    }
}

INSTANTIATE_TEST_SUITE_P(AdamWHost, EveryKernel,
                         ::testing::Values(HostIsa::scalar, HostIsa::avx2, HostIsa::avx512),
                         [](const ::testing::TestParamInfo<HostIsa>& info) {
                           return std::string(llm::to_string(info.param));
                         });

// The public entry point at several thread counts (blocks split between threads) against the
// functor loop, with the compute copy, for both gradient types.
TEST(AdamWHost, ThreadedUpdateEqualsTheScalarFunctorBitwise) {
  for (const Case& c : all_cases())
    for (int64_t numel : {int64_t{1023}, int64_t{100003}, int64_t{(1 << 17) + 5}})
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(describe(c, numel, 0) + ", threads " + std::to_string(threads));
        State expected(numel, 0, c.bf16_grad, 7);
        State actual = expected.clone();
        for (int step = 1; step <= kSteps; ++step) {
          const llm::AdamWScalars scalars = scalars_of(c, step);
          reference_step(expected, scalars);
          const auto update = [&](const auto* grad) {
            llm::adamw_update_host(actual.param.data_ptr<float>(), grad, actual.exp_avg.data_ptr<float>(),
                                   actual.exp_avg_sq.data_ptr<float>(), numel, scalars,
                                   actual.compute.data_ptr<at::BFloat16>(), threads);
          };
          if (c.bf16_grad)
            update(actual.grad.const_data_ptr<at::BFloat16>());
          else
            update(actual.grad.const_data_ptr<float>());
        }
        expect_same_state(actual, expected, expected.param.to(at::kBFloat16));
      }
}

// The rounding itself on values chosen for it: at lr = 0 and no decay the master keeps its bits,
// so the compute copy is exactly the rounding of the values put in. Ties round to even, the
// largest floats round to infinity, subnormals and signed zeros keep their sign; NaN becomes
// c10::BFloat16's 0x7FC0 (ATen's vectorised to(kBFloat16) writes 0xFFFF for NaN, so NaN is compared
// with the scalar conversion only).
TEST(AdamWHost, Bf16ComputeCopyRoundsLikeC10) {
  const std::vector<uint32_t> patterns = {
      0x3F800000, 0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F807FFF, 0xBF808000, 0x7F7FFFFF,
      0xFF7FFFFF, 0x7F7F8000, 0x00000001, 0x80008000, 0x00018000, 0x00000000, 0x80000000,
      0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x4049FDB0, 0xC2F6E979};
  // Repeated to 67 values so every kernel's vector body, not only its tail, sees each pattern.
  std::vector<float> values;
  while (values.size() < 67)
    for (uint32_t bits : patterns) {
      float value;
      std::memcpy(&value, &bits, sizeof(value));
      values.push_back(value);
    }
  values.resize(67);
  const int64_t numel = static_cast<int64_t>(values.size());
  const at::Tensor original = at::from_blob(values.data(), {numel}, at::kFloat).clone();
  const llm::AdamWScalars scalars = llm::make_adamw_scalars(0.0, 0.9, 0.999, 1e-8, 0.0, 1);
  for (HostIsa isa : {HostIsa::scalar, HostIsa::avx2, HostIsa::avx512}) {
    if (!llm::host_isa_supported(isa)) continue;
    SCOPED_TRACE(llm::to_string(isa));
    at::Tensor param = original.clone();
    const at::Tensor grad = at::ones({numel});
    at::Tensor exp_avg = at::zeros({numel}), exp_avg_sq = at::zeros({numel});
    at::Tensor compute = at::empty({numel}, at::kBFloat16);
    llm::adamw_host_range(
        isa,
        {param.data_ptr<float>(), grad.const_data_ptr(), false, exp_avg.data_ptr<float>(),
         exp_avg_sq.data_ptr<float>(), reinterpret_cast<uint16_t*>(compute.data_ptr<at::BFloat16>())},
        scalars, 0, numel);
    const at::Tensor not_nan = original == original;  // NaN * 1 may come back quieted
    expect_same_bits(param.masked_select(not_nan), original.masked_select(not_nan), "param at lr 0");
    expect_same_bits(compute.masked_select(not_nan), original.masked_select(not_nan).to(at::kBFloat16),
                     "compute copy vs to(kBFloat16)");
    const auto* out = reinterpret_cast<const uint16_t*>(compute.const_data_ptr<at::BFloat16>());
    for (int64_t i = 0; i < numel; ++i)
      EXPECT_EQ(out[i], c10::BFloat16(values[i]).x) << "element " << i << " = " << values[i];
  }
}

// The tensor entry point with a compute copy (what CPU offload's step writes for the device): the
// master and moments are those of the plain update, the copy is master.to(dtype), for a bf16 copy
// (written in the kernel's pass) and an fp32 one (copied after); a wrong-sized copy is refused.
TEST(AdamWHost, UpdateWithComputeCopyEqualsUpdateThenRound) {
  const llm::AdamWOptions options{0.9, 0.999, 1e-8, 0.1};
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    for (const at::ScalarType grad_dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " copy, " + c10::toString(grad_dtype) + " grad");
      at::manual_seed(7);
      const int64_t numel = 100003;
      const at::Tensor start = at::randn({numel});
      const at::Tensor grad = at::randn({numel}).to(grad_dtype);
      at::Tensor plain = start.clone(), plain_m = at::zeros({numel}), plain_v = at::zeros({numel});
      at::Tensor fused = start.clone(), fused_m = at::zeros({numel}), fused_v = at::zeros({numel});
      at::Tensor copy = at::empty({numel}, dtype);
      for (int64_t step = 1; step <= kSteps; ++step) {
        llm::adamw_update(plain, grad, plain_m, plain_v, 1e-2, options, 0.1, step);
        llm::adamw_update(fused, grad, fused_m, fused_v, 1e-2, options, 0.1, step, copy, llm::StateRounding{});
        expect_same_bits(copy, plain.to(dtype), "compute copy at step " + std::to_string(step));
      }
      expect_same_bits(fused, plain, "master");
      expect_same_bits(fused_m, plain_m, "exp_avg");
      expect_same_bits(fused_v, plain_v, "exp_avg_sq");
      at::Tensor short_copy = at::empty({numel - 1}, dtype);
      EXPECT_THROW(llm::adamw_update(fused, grad, fused_m, fused_v, 1e-2, options, 0.1, kSteps + 1, short_copy, llm::StateRounding{}),
                   std::exception);
    }
  }
}

TEST(AdamWHost, DispatchPicksTheWidestSupportedKernel) {
  const HostIsa best = llm::best_host_isa();
  EXPECT_TRUE(llm::host_isa_supported(best));
  if (llm::host_isa_supported(HostIsa::avx512)) EXPECT_EQ(best, HostIsa::avx512);
  else if (llm::host_isa_supported(HostIsa::avx2)) EXPECT_EQ(best, HostIsa::avx2);
  else EXPECT_EQ(best, HostIsa::scalar);
  for (HostIsa isa : {HostIsa::avx2, HostIsa::avx512}) {
    if (llm::host_isa_supported(isa)) continue;
    float x = 0, g = 0, m = 0, v = 0;
    EXPECT_THROW(llm::adamw_host_range(isa, {&x, &g, false, &m, &v, nullptr},
                                       llm::make_adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0, 1), 0, 1),
                 std::logic_error)
        << "an unsupported kernel must not run";
  }
  std::printf("[          ] host AdamW kernel on this CPU: %s\n", llm::to_string(best));
}

// Sets an environment variable for one scope and restores what was there.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnvironment() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(HostThreads, LocalRanksShareTheCores) {
  ScopedEnvironment ompi("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr), mpich("MPI_LOCALNRANKS", nullptr),
      slurm("SLURM_NTASKS_PER_NODE", nullptr), torchrun("LOCAL_WORLD_SIZE", nullptr);
  EXPECT_EQ(llm::local_ranks_from_environment(), 1) << "a plain process is one rank";
  {
    ScopedEnvironment two("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    EXPECT_EQ(llm::local_ranks_from_environment(), 2);
  }
  {
    ScopedEnvironment three("MPI_LOCALNRANKS", "3");
    EXPECT_EQ(llm::local_ranks_from_environment(), 3);
  }
  {
    ScopedEnvironment junk("LOCAL_WORLD_SIZE", "many");
    EXPECT_EQ(llm::local_ranks_from_environment(), 1) << "unreadable values are ignored";
  }
  const int cores = llm::cores_available();
  ASSERT_GE(cores, 1);
  EXPECT_EQ(llm::default_host_step_threads(1), cores) << "one rank takes every core it may use";
  const bool unbound = cores == static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  for (int ranks : {1, 2, 3, 4, 64}) {
    const int threads = llm::default_host_step_threads(ranks);
    EXPECT_GE(threads, 1);
    if (!unbound) continue;  // bound by a launcher: the mask is this rank's share (host_threads.h)
    EXPECT_EQ(threads, std::max(1, cores / ranks)) << ranks << " ranks on " << cores << " cores";
  }
  {
    ScopedEnvironment two("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    EXPECT_EQ(llm::default_host_step_threads(), llm::default_host_step_threads(2));
  }
}

}  // namespace
}  // namespace optim_adamw_host_test
