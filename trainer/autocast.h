// RAII autocast region: LibTorch has no C++ guard, so this mirrors Python's torch.autocast
// __enter__/__exit__ (set enabled + dtype, bump nesting; on exit clear the weight-cast cache when the
// outermost region ends, then restore). Backward runs outside the region, as in Python.
#pragma once

#include <ATen/autocast_mode.h>

namespace llm {

class AutocastRegion {
 public:
  AutocastRegion(c10::DeviceType device_type, at::ScalarType dtype, bool enabled)
      : device_type_(device_type), enabled_(enabled) {
    if (!enabled_) return;
    previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
    previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
    at::autocast::set_autocast_enabled(device_type_, true);
    at::autocast::set_autocast_dtype(device_type_, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastRegion() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
    at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  }
  AutocastRegion(const AutocastRegion&) = delete;
  AutocastRegion& operator=(const AutocastRegion&) = delete;

 private:
  c10::DeviceType device_type_;
  bool enabled_;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

}  // namespace llm
