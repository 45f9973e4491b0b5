// A tensor padded with zeros at the end of some dimensions (the compute side's matmul padding,
// --pad_matmul_dims: model/units.h) and its logical part, the leading `shape` of each dimension.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace llm {

// The logical part of `padded`: a view (narrowed where a dimension is longer), `padded` itself when
// nothing is padded.
inline at::Tensor logical_view(const std::vector<int64_t>& shape, const at::Tensor& padded) {
  at::Tensor view = padded;
  for (size_t d = 0; d < shape.size(); ++d)
    if (view.size(static_cast<int64_t>(d)) != shape[d]) view = view.narrow(static_cast<int64_t>(d), 0, shape[d]);
  return view;
}

// Zeroes what lies outside the logical part (the pads).
inline void zero_padding(const std::vector<int64_t>& shape, const at::Tensor& padded) {
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t size = padded.size(static_cast<int64_t>(d));
    if (size != shape[d]) padded.narrow(static_cast<int64_t>(d), shape[d], size - shape[d]).zero_();
  }
}

}  // namespace llm
