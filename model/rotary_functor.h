// Rotary embedding, x * cos + roll(x, D/2) * sin_signed (model/layer_ops.h's form), forward and
// backward for one element, written once for the CPU loop (model/layer_ops.cpp) and the CUDA kernel
// (model/rotary_cuda.cu). x is laid out (B, T, heads, D) as the q and k projections write it, the
// tables (T, D). Each step replays eager's roundings: the products and their sum in the output's dtype
// O (bf16 only when x and the tables are bf16: pure bf16; fp32 when either is fp32, e.g. bf16 q under
// autocast times fp32 tables), and in backward each of x's two gradient terms cast to x's dtype before
// they are added there, as autograd adds them:
//
//   out[d] = O(O(x[d] * cos[d]) + O(x[d'] * sin[d]))                        d' = (d + D/2) mod D
//   dx[d]  = X(X(O(g[d] * cos[d])) + X(O(g[d'] * sin[d'])))
//
// LibTorch-free: nvcc compiles it as C++17.
#pragma once

#include <cstdint>
#include <type_traits>

#include "model/element_io.h"  // element_to_float, store_element, round_like (fp32 / bf16 bits)

namespace llm {

// Eager runs the products and the sum as separate kernels, so nothing may fuse them into an FMA here:
// on the device the round-to-nearest intrinsics, which nvcc never contracts (on the host the trainer
// builds without FMA instructions).
LLM_HOST_DEVICE float multiply_rounded(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LLM_HOST_DEVICE float add_rounded(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// The (B, T, heads, D) element i's position t and lane d.
struct RotaryGeometry {
  int64_t seq, heads, head_dim;
  LLM_HOST_DEVICE int64_t lane(int64_t i) const { return i % head_dim; }
  LLM_HOST_DEVICE int64_t position(int64_t i) const { return (i / (head_dim * heads)) % seq; }
  // The element whose lane is rolled onto i's: the same row, lane (d + D/2) mod D.
  LLM_HOST_DEVICE int64_t partner(int64_t i) const {
    const int64_t d = lane(i), half = head_dim / 2;
    return i - d + (d + half) % head_dim;
  }
};

// X: x's element type, T: the tables', O: the output's (float, or uint16_t for bf16 bits). Both
// passes read `in` and write `out`: forward x -> the rotated x, backward d out -> d x.
template <typename X, typename T, typename O>
struct RotaryForward {
  const X* in;
  const T* cos;
  const T* sin_signed;
  O* out;
  RotaryGeometry shape;
  LLM_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t table = shape.position(i) * shape.head_dim + shape.lane(i);
    const float a = round_like(O{}, multiply_rounded(element_to_float(in[i]), element_to_float(cos[table])));
    const float b =
        round_like(O{}, multiply_rounded(element_to_float(in[shape.partner(i)]), element_to_float(sin_signed[table])));
    store_element(out + i, add_rounded(a, b));
  }
};

template <typename X, typename T, typename O>
struct RotaryBackward {
  const O* in;
  const T* cos;
  const T* sin_signed;
  X* out;
  RotaryGeometry shape;
  LLM_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t row = shape.position(i) * shape.head_dim;
    const int64_t j = shape.partner(i);
    const float a = round_like(
        X{}, round_like(O{}, multiply_rounded(element_to_float(in[i]), element_to_float(cos[row + shape.lane(i)]))));
    const float b = round_like(
        X{}, round_like(O{}, multiply_rounded(element_to_float(in[j]), element_to_float(sin_signed[row + shape.lane(j)]))));
    store_element(out + i, add_rounded(a, b));
  }
};

// One pass of the rotary over untyped pointers: builds the pass for the element types the run has
// (x and tables bf16; bf16 x with fp32 tables, as under autocast; both fp32) and hands it to `run`
// (a loop on the host, Thrust on the device), so both places dispatch alike.
template <template <typename, typename, typename> class Pass, typename Run>
void with_rotary_pass(bool x_bf16, bool tables_bf16, const void* in, const void* cos, const void* sin_signed, void* out,
                      const RotaryGeometry& shape, Run&& run) {
  const auto make = [&](auto typed) {
    using P = decltype(typed);
    using In = std::remove_pointer_t<decltype(P::in)>;
    using Table = std::remove_pointer_t<decltype(P::cos)>;
    using Out = std::remove_pointer_t<decltype(P::out)>;
    return P{static_cast<In*>(in), static_cast<Table*>(cos), static_cast<Table*>(sin_signed), static_cast<Out*>(out),
             shape};
  };
  if (x_bf16 && tables_bf16)
    run(make(Pass<uint16_t, uint16_t, uint16_t>{}));
  else if (x_bf16)
    run(make(Pass<uint16_t, float, float>{}));
  else
    run(make(Pass<float, float, float>{}));
}

}  // namespace llm
