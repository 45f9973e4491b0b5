// The single-pass cross entropy on the GPU (model/cross_entropy_functor.h): one block of
// kCrossEntropyLanes threads a row. Each thread keeps its lane's online softmax state; the states
// merge in the functor's tree (shared memory down to a warp, then shuffles: lane i takes lane i + k
// at every level, as the CPU loop does); thread 0 writes the row's loss; then every thread writes its
// columns of the gradient. The logits are read twice and the gradient written once, where ATen's
// cross_entropy reads and writes (tokens x vocab) about six times and the blocked loss
// (model/cross_entropy.cpp) three or four.
#include "model/layer_kernels.h"

#include <string>

#include "common/errors.h"
#include "model/cross_entropy_functor.h"

namespace llm {
namespace {

__device__ SoftmaxState shuffle_down(SoftmaxState state, int offset) {
  state.max = __shfl_down_sync(0xffffffffu, state.max, offset);
  state.sum = __shfl_down_sync(0xffffffffu, state.sum, offset);
  return state;
}

template <typename T>
__global__ void __launch_bounds__(kCrossEntropyLanes) cross_entropy_rows_kernel(CrossEntropyRow<T> row_pass) {
  __shared__ SoftmaxState states[kCrossEntropyLanes];
  const int64_t row = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x);
  SoftmaxState state = row_pass.lane_state(row, lane, kCrossEntropyLanes);
  states[lane] = state;
  __syncthreads();
  for (int k = kCrossEntropyLanes / 2; k >= 32; k /= 2) {
    if (lane < k) states[lane] = softmax_merge(states[lane], states[lane + k]);
    __syncthreads();
  }
  if (lane < 32) {
    state = states[lane];
    for (int k = 16; k >= 1; k /= 2) {
      const SoftmaxState other = shuffle_down(state, k);
      state = softmax_merge(state, other);
    }
    if (lane == 0) {
      states[0] = state;
      row_pass.write_loss(row, state);
    }
  }
  __syncthreads();
  if (row_pass.gradient != nullptr) row_pass.write_gradient(row, states[0], lane, kCrossEntropyLanes);
}

template <typename T>
void launch_rows(const CrossEntropyRow<T>& row_pass, int64_t rows, cudaStream_t stream) {
  if (rows == 0) return;
  cross_entropy_rows_kernel<T><<<static_cast<unsigned>(rows), kCrossEntropyLanes, 0, stream>>>(row_pass);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw SystemError(std::string("cross entropy: the CUDA kernel failed to launch: ") + cudaGetErrorString(status));
}

}  // namespace

void launch_cross_entropy_cuda(const void* logits, const int64_t* labels, void* gradient, const float* scale,
                               float* losses, int64_t rows, int64_t vocab, int64_t stride, bool bf16,
                               cudaStream_t stream) {
  if (bf16)
    launch_rows(CrossEntropyRow<uint16_t>{static_cast<const uint16_t*>(logits), labels, static_cast<uint16_t*>(gradient),
                                          scale, losses, vocab, stride},
                rows, stream);
  else
    launch_rows(CrossEntropyRow<float>{static_cast<const float*>(logits), labels, static_cast<float*>(gradient), scale,
                                       losses, vocab, stride},
                rows, stream);
}

}  // namespace llm
