#include "common/owned_bytes.h"

#include <algorithm>

namespace llm {

int64_t distinct_storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::vector<const void*> seen;
  int64_t bytes = 0;
  for (const at::Tensor& tensor : tensors) {
    if (!tensor.defined()) continue;
    const void* storage = tensor.storage().unsafeGetStorageImpl();
    if (std::find(seen.begin(), seen.end(), storage) != seen.end()) continue;
    seen.push_back(storage);
    bytes += static_cast<int64_t>(tensor.storage().nbytes());
  }
  return bytes;
}

}  // namespace llm
