// bf16 optimizer state (--optimizer_state_dtype bfloat16) in one process:
//  * every host AdamW kernel this CPU runs (scalar, AVX2, AVX-512) with bf16 moments against the
//    element functor, bit for bit: sizes around the vector widths, fp32 and bf16 gradients, both
//    lerp forms, with and without the compute copy, an index base that wraps past 2^32, threaded;
//  * the rounding of the HF rules (store_stochastically_rounded: on the host, and with a GPU its CUDA
//    kernel) against the specification's scalar function (optim/state_rounding.h), bit for bit, with NaN, infinities, signed zeros,
//    subnormals and the largest finite values;
//  * the rounding is unbiased (the mean of many roundings is the value) and every bf16 value is
//    kept exactly;
//  * on a GPU (skipped here): the CUDA kernel with bf16 moments gives the host kernel's bits.
// The NumPy specification itself is checked against the sharded optimizer in
// tests/mpi/optim_reference_test.cpp (Bf16StateReference) at 1 to 4 ranks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "common/errors.h"
#include "optim/adamw.h"
#include "optim/adamw_functor.h"
#include "optim/adamw_host.h"
#include "optim/state_rounding.h"
#include "optim/update_rules.h"
#include "tests/tensor_checks.h"

namespace optim_state_dtype_test {
namespace {

using llm::HostIsa;
using llm::testing::expect_same_bits;

struct Arrays {
  at::Tensor param, grad, exp_avg, exp_avg_sq, compute;
  Arrays(int64_t numel, bool bf16_grad, uint64_t seed) {
    at::manual_seed(seed);
    param = at::randn({numel});
    grad = bf16_grad ? at::randn({numel}).to(at::kBFloat16) : at::randn({numel});
    exp_avg = (at::randn({numel}) * 0.1).to(at::kBFloat16);
    exp_avg_sq = (at::rand({numel}) * 0.01).to(at::kBFloat16);
    compute = at::zeros({numel}, at::kBFloat16);
  }
  Arrays clone() const {
    Arrays copy = *this;
    for (at::Tensor* t : {&copy.param, &copy.grad, &copy.exp_avg, &copy.exp_avg_sq, &copy.compute}) *t = t->clone();
    return copy;
  }
  llm::AdamWHostArrays host(bool write_compute, const llm::StateRounding& rounding) {
    llm::AdamWHostArrays arrays{param.data_ptr<float>(), grad.const_data_ptr(), grad.scalar_type() == at::kBFloat16,
                                nullptr, nullptr,
                                write_compute ? reinterpret_cast<uint16_t*>(compute.data_ptr<at::BFloat16>()) : nullptr};
    arrays.exp_avg_bf16 = reinterpret_cast<uint16_t*>(exp_avg.data_ptr<at::BFloat16>());
    arrays.exp_avg_sq_bf16 = reinterpret_cast<uint16_t*>(exp_avg_sq.data_ptr<at::BFloat16>());
    arrays.rounding = rounding;
    return arrays;
  }
};

template <typename Grad, bool kLerpFromStart>
void functor_loop(Arrays& a, const llm::AdamWScalars& scalars, const llm::StateRounding& rounding) {
  const llm::AdamWElementUpdate<Grad, kLerpFromStart, uint16_t> update{
      a.param.data_ptr<float>(), static_cast<const Grad*>(a.grad.const_data_ptr()),
      reinterpret_cast<uint16_t*>(a.exp_avg.data_ptr<at::BFloat16>()),
      reinterpret_cast<uint16_t*>(a.exp_avg_sq.data_ptr<at::BFloat16>()), scalars, rounding};
  for (int64_t i = 0; i < a.param.numel(); ++i) update(i);
}

void reference_step(Arrays& a, const llm::AdamWScalars& scalars, const llm::StateRounding& rounding) {
  const bool bf16 = a.grad.scalar_type() == at::kBFloat16;
  if (bf16 && scalars.exp_avg_lerp_from_start) functor_loop<c10::BFloat16, true>(a, scalars, rounding);
  if (bf16 && !scalars.exp_avg_lerp_from_start) functor_loop<c10::BFloat16, false>(a, scalars, rounding);
  if (!bf16 && scalars.exp_avg_lerp_from_start) functor_loop<float, true>(a, scalars, rounding);
  if (!bf16 && !scalars.exp_avg_lerp_from_start) functor_loop<float, false>(a, scalars, rounding);
}

class EveryKernelBf16State : public ::testing::TestWithParam<HostIsa> {};

TEST_P(EveryKernelBf16State, EqualsTheScalarFunctorBitwise) {
  const HostIsa isa = GetParam();
  if (!llm::host_isa_supported(isa)) GTEST_SKIP() << "this CPU (or build) has no " << llm::to_string(isa) << " kernel";
  for (const int64_t numel : {1, 7, 15, 16, 17, 33, 1023, 100003})
    for (const bool bf16_grad : {false, true})
      for (const double beta1 : {0.9, 0.3})
        for (const bool write_compute : {false, true})
          for (const uint32_t base : {0u, 0xFFFFFFF0u}) {  // the second wraps past 2^32 mid-array
            SCOPED_TRACE(std::string(llm::to_string(isa)) + " numel " + std::to_string(numel) +
                         (bf16_grad ? " bf16" : " fp32") + " grad, beta1 " + std::to_string(beta1) +
                         (write_compute ? ", compute copy" : "") + ", base " + std::to_string(base));
            Arrays actual(numel, bf16_grad, 11 + numel), expected = actual.clone();
            for (int step = 1; step <= 3; ++step) {
              const auto scalars = llm::make_adamw_scalars(1e-3 * step, beta1, 0.999, 1e-8, 0.1, step);
              const llm::StateRounding rounding{llm::rounding_key(5, step, 3), base};
              llm::adamw_host_range(isa, actual.host(write_compute, rounding), scalars, 0, numel);
              reference_step(expected, scalars, rounding);
              if (write_compute) expected.compute.copy_(expected.param);
            }
            expect_same_bits(actual.param, expected.param, "param");
            expect_same_bits(actual.exp_avg, expected.exp_avg, "exp_avg");
            expect_same_bits(actual.exp_avg_sq, expected.exp_avg_sq, "exp_avg_sq");
            if (write_compute) expect_same_bits(actual.compute, expected.compute, "compute copy");
          }
}

INSTANTIATE_TEST_SUITE_P(AdamWHost, EveryKernelBf16State,
                         ::testing::Values(HostIsa::scalar, HostIsa::avx2, HostIsa::avx512),
                         [](const ::testing::TestParamInfo<HostIsa>& info) { return llm::to_string(info.param); });

// The threaded entry point (chunks taken dynamically) through adamw_update's tensor API.
TEST(Bf16State, ThreadedTensorUpdateEqualsTheScalarFunctorBitwise) {
  for (const int threads : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    const int64_t numel = (1 << 18) + 5;
    Arrays actual(numel, false, 3), expected = actual.clone();
    const llm::StateRounding rounding{llm::rounding_key(1, 1, 0), 12345};
    const int before = at::get_num_threads();
    at::set_num_threads(threads);
    llm::adamw_update(actual.param, actual.grad, actual.exp_avg, actual.exp_avg_sq, 1e-3, llm::AdamWOptions{}, 0.0, 1,
                      actual.compute, rounding);
    at::set_num_threads(before);
    reference_step(expected, llm::make_adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, 1), rounding);
    expect_same_bits(actual.param, expected.param, "param");
    expect_same_bits(actual.exp_avg, expected.exp_avg, "exp_avg");
    expect_same_bits(actual.exp_avg_sq, expected.exp_avg_sq, "exp_avg_sq");
    expect_same_bits(actual.compute, expected.param.to(at::kBFloat16), "compute copy");
  }
}

// bf16 moments need their rounding: the overload without one refuses them (a fixed key would round
// alike at every step, a bias).
TEST(Bf16State, MomentsWithoutTheirRoundingAreRefused) {
  Arrays a(64, false, 1);
  EXPECT_THROW(llm::adamw_update(a.param, a.grad, a.exp_avg, a.exp_avg_sq, 1e-3, llm::AdamWOptions{}, 0.0, 1),
               llm::UserError);
}

// The specification's rounding, element by element.
at::Tensor spec_rounding(const at::Tensor& values, const llm::StateRounding& rounding, bool high_half) {
  at::Tensor out = at::empty({values.numel()}, at::kBFloat16);
  auto* to = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float* from = values.const_data_ptr<float>();
  for (int64_t i = 0; i < values.numel(); ++i) {
    const uint32_t bits = llm::rounding_bits(rounding.key, rounding.index_base + static_cast<uint32_t>(i));
    to[i] = llm::stochastic_round_to_bfloat16(from[i], high_half ? bits >> 16 : bits & 0xFFFFu);
  }
  return out;
}

TEST(Bf16State, AtenRoundingEqualsTheSpecificationBitwise) {
  at::manual_seed(4);
  at::Tensor values = at::randn({70000}) * at::exp(at::randn({70000}) * 8);
  const float special[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                           1e-40f, -1e-40f, 1.0f, 1.00390625f};
  for (size_t i = 0; i < std::size(special); ++i) values[static_cast<int64_t>(i)] = special[i];
  for (const uint32_t base : {0u, 1000u, 0xFFFF0000u})
    for (const bool high : {false, true}) {
      SCOPED_TRACE("base " + std::to_string(base) + (high ? ", high half" : ", low half"));
      const llm::StateRounding rounding{llm::rounding_key(42, 17, 5), base};
      at::Tensor destination = at::empty({values.numel()}, at::kBFloat16);
      llm::store_stochastically_rounded(destination, values, rounding, high);
      expect_same_bits(destination, spec_rounding(values, rounding, high), "rounded");
      if (at::hasCUDA()) {  // the CUDA kernel (optim/adamw_cuda.cu) on a GPU
        at::Tensor on_device = at::empty({values.numel()}, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
        llm::store_stochastically_rounded(on_device, values.cuda(), rounding, high);
        expect_same_bits(on_device.cpu(), spec_rounding(values, rounding, high), "rounded on the GPU");
      }
    }
}

// E[round(x)] = x: 2^20 roundings of a value a quarter of the way from one bf16 to the next (bf16
// values near 1 are 2^-7 apart) average to it: the standard error is 2^-7 sqrt(3/16) / 2^10 ~ 3.3e-6,
// and the deterministic bits give one fixed draw, asserted at 1.5e-5 (4.5 standard errors). Every
// value that is a bf16 already is kept as it is.
TEST(Bf16State, RoundingIsUnbiasedAndKeepsBf16Values) {
  const int64_t count = 1 << 20;
  const double value = 1.0 + std::ldexp(1.0, -9);
  for (const bool high : {false, true}) {
    const at::Tensor rounded =
        spec_rounding(at::full({count}, static_cast<float>(value)), {llm::rounding_key(7, 1, 0), 0}, high);
    EXPECT_NEAR(rounded.to(at::kDouble).mean().item<double>(), value, 1.5e-5);
    const double up = (rounded.to(at::kFloat) > 1.0f).to(at::kDouble).mean().item<double>();
    EXPECT_NEAR(up, 0.25, 0.002) << "rounds up with the probability of the dropped fraction";
  }
  const at::Tensor exact = at::randn({10000}).to(at::kBFloat16).to(at::kFloat);
  expect_same_bits(spec_rounding(exact, {llm::rounding_key(3, 2, 1), 0}, false), exact.to(at::kBFloat16), "exact");
}

// The CUDA kernel with bf16 moments against the host kernel (the same functor): bit for bit.
TEST(Bf16State, CudaKernelEqualsTheHostKernelBitwise) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const bool bf16_grad : {false, true}) {
    Arrays host(100003, bf16_grad, 9);
    at::Tensor param = host.param.cuda(), grad = host.grad.cuda(), m = host.exp_avg.cuda(), v = host.exp_avg_sq.cuda();
    at::Tensor none;
    const llm::StateRounding rounding{llm::rounding_key(1, 3, 2), 77};
    for (int step = 1; step <= 3; ++step) {
      llm::adamw_update(host.param, host.grad, host.exp_avg, host.exp_avg_sq, 1e-3, llm::AdamWOptions{}, 0.1, step, none,
                        rounding);
      llm::adamw_update(param, grad, m, v, 1e-3, llm::AdamWOptions{}, 0.1, step, none, rounding);
    }
    expect_same_bits(param.cpu(), host.param, "param");
    expect_same_bits(m.cpu(), host.exp_avg, "exp_avg");
    expect_same_bits(v.cpu(), host.exp_avg_sq, "exp_avg_sq");
  }
}

}  // namespace
}  // namespace optim_state_dtype_test
