// What one owner of training memory holds now, in the memory ledger's owned categories
// (memory/categories.h). Each owner (a sharded unit, the optimizer) reports its own bytes,
// counted from the buffers it holds at that moment, so a buffer a feature adds is counted where it
// is allocated rather than by a reader that knows the owner's insides.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace llm {

struct OwnedBytes {
  int64_t parameters = 0;        // master shards, compute shards, gathered parameters
  int64_t gradients = 0;         // gradient shards, full gradients not yet reduced
  int64_t optimizer_device = 0;  // optimizer state on the training device (the CPU for a CPU run)
  int64_t optimizer_host = 0;    // what offload keeps in host memory: optimizer state, masters, parameter rows

  OwnedBytes& operator+=(const OwnedBytes& other) {
    parameters += other.parameters;
    gradients += other.gradients;
    optimizer_device += other.optimizer_device;
    optimizer_host += other.optimizer_host;
    return *this;
  }
};

// Bytes of the distinct storages among the tensors: views of one storage count once, undefined
// tensors and freed storage count 0.
int64_t distinct_storage_bytes(const std::vector<at::Tensor>& tensors);

}  // namespace llm
