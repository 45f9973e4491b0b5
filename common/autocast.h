// RAII autocast region: LibTorch has no C++ guard, so this mirrors Python's torch.autocast
// __enter__/__exit__ (set enabled + dtype, bump nesting; on exit clear the weight-cast cache when the
// outermost region ends, then restore). Backward runs outside the region, as in Python.
//
// AutocastCache::off is torch.autocast(cache_enabled=False): each reader of a tensor casts it
// itself. Recomputation in backward (model/recompute.h) needs it: there the inputs are leaves that
// require grad, and a shared cast would sum their readers' gradients in bf16 before the cast back.
#pragma once

#include <ATen/autocast_mode.h>

namespace llm {

enum class AutocastCache { on, off };

class AutocastRegion {
 public:
  AutocastRegion(c10::DeviceType device_type, at::ScalarType dtype, bool enabled,
                 AutocastCache cache = AutocastCache::on)
      : device_type_(device_type), enabled_(enabled) {
    if (!enabled_) return;
    previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
    previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
    previous_cache_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(device_type_, true);
    at::autocast::set_autocast_dtype(device_type_, dtype);
    at::autocast::set_autocast_cache_enabled(cache == AutocastCache::on && previous_cache_);
    at::autocast::increment_nesting();
  }
  ~AutocastRegion() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
    at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
    at::autocast::set_autocast_cache_enabled(previous_cache_);
  }
  AutocastRegion(const AutocastRegion&) = delete;
  AutocastRegion& operator=(const AutocastRegion&) = delete;

 private:
  c10::DeviceType device_type_;
  bool enabled_;
  bool previous_enabled_ = false;
  bool previous_cache_ = true;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

}  // namespace llm
