// The single-pass cross entropy of one row of logits (--fused_ops cross_entropy), written once for the
// CUDA kernel (model/cross_entropy_kernels.cu: one thread block a row) and the CPU loop that the CPU
// tests check (model/cross_entropy.cpp: one row at a time, its lanes in turn):
//
//   1. each of kCrossEntropyLanes lanes walks the row's columns lane, lane + lanes, ... keeping an online
//      softmax state (the running max m and sum s of exp(x - m)): the logits are read once for the
//      loss, with no fp32 copy and no buffer of exponentials;
//   2. the lanes' states merge in a fixed tree (lane i takes lane i + k for k = lanes/2, ..., 1), so
//      the row's max and sum do not depend on who runs it; loss = m + log(s) - x[label];
//   3. when a gradient is wanted, a second read writes (exp(x - m) * (scale / s) - [label] * scale)
//      rounded once to the logits' dtype, where ATen's backward through the upcast rounds it; it may be
//      written over the logits themselves (each element is read, then written, by one lane), and the
//      columns past the vocabulary in a padded row get zeros.
// A label of -100 is ignored (loss 0, gradient 0); one outside [0, vocab) gives a NaN loss (the
// kernel cannot throw; the trainer stops on a non-finite loss).
// LibTorch-free: nvcc compiles it as C++17.
#pragma once

#include <cmath>
#include <cstdint>

#include "model/element_io.h"

namespace llm {

constexpr int kCrossEntropyLanes = 256;  // the CUDA block's threads; the CPU loop's lanes
constexpr int64_t kCrossEntropyIgnore = -100;

// A run of logits' max and the sum of exp(x - max) over it. Empty: max -inf, sum 0.
struct SoftmaxState {
  float max;
  float sum;
};

LLM_HOST_DEVICE SoftmaxState softmax_empty() { return {-INFINITY, 0.0f}; }

// The state with one more logit. A NaN makes the sum NaN (as ATen's loss is NaN then); -inf adds 0.
LLM_HOST_DEVICE SoftmaxState softmax_add(SoftmaxState state, float x) {
  if (x > state.max) {
    state.sum = state.sum * exp_like_aten(state.max - x) + 1.0f;
    state.max = x;
  } else if (x != -INFINITY) {
    state.sum += exp_like_aten(x - state.max);
  }
  return state;
}

// The state of two runs together.
LLM_HOST_DEVICE SoftmaxState softmax_merge(SoftmaxState a, SoftmaxState b) {
  if (b.sum == 0.0f) return a;
  if (a.sum == 0.0f) return b;
  if (b.max > a.max) {
    const SoftmaxState t = a;
    a = b;
    b = t;
  }
  a.sum += b.sum * exp_like_aten(b.max - a.max);
  return a;
}

// One row's pieces. T: float, or uint16_t for bf16 bits. The row starts at logits + row * stride;
// its first `vocab` columns count. The gradient (may be the logits) has the same layout.
template <typename T>
struct CrossEntropyRow {
  const T* logits;
  const int64_t* labels;
  T* gradient;          // nullptr: the loss only
  const float* scale;   // the gradient's factor (1 / counted rows), read where the gradient is written
  float* losses;        // one a row: fp32, 0 on ignored rows
  int64_t vocab = 0;
  int64_t stride = 0;

  // Step 1 for one lane.
  LLM_HOST_DEVICE SoftmaxState lane_state(int64_t row, int lane, int lanes) const {
    SoftmaxState state = softmax_empty();
    const T* x = logits + row * stride;
    for (int64_t c = lane; c < vocab; c += lanes) state = softmax_add(state, element_to_float(x[c]));
    return state;
  }

  // Step 2's loss from the merged state.
  LLM_HOST_DEVICE void write_loss(int64_t row, SoftmaxState state) const {
    const int64_t label = labels[row];
    float loss = 0.0f;
    if (label != kCrossEntropyIgnore) {
      loss = (label < 0 || label >= vocab)
                 ? NAN
                 : state.max + log_like_aten(state.sum) - element_to_float(logits[row * stride + label]);
    }
    losses[row] = loss;
  }

  // Step 3 for one lane: its columns of the row's gradient, and of the padding past the vocabulary.
  LLM_HOST_DEVICE void write_gradient(int64_t row, SoftmaxState state, int lane, int lanes) const {
    const int64_t label = labels[row];
    const bool counted = label != kCrossEntropyIgnore;
    const float row_scale = counted ? *scale : 0.0f;
    const float factor = row_scale / state.sum;
    const T* x = logits + row * stride;
    T* g = gradient + row * stride;
    for (int64_t c = lane; c < vocab; c += lanes) {
      float value = exp_like_aten(element_to_float(x[c]) - state.max) * factor;
      if (c == label) value += -row_scale;
      store_element(g + c, counted ? value : 0.0f);
    }
    for (int64_t c = vocab + lane; c < stride; c += lanes) store_element(g + c, 0.0f);
  }
};

}  // namespace llm
