// The keyed window order: exactly the specification in data/window_order.h, nothing more.
#include "data/window_order.h"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>

namespace llm {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;  // SplitMix64's increment

// F(k, R): the round function, a word of h bits.
inline uint64_t round_function(uint64_t key, uint64_t right, uint64_t half_mask) {
  return mix64(key ^ right) & half_mask;
}

}  // namespace

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

KeyedPermutation::Keys epoch_keys(uint64_t seed, uint64_t epoch) {
  uint64_t state = mix64(seed) ^ mix64(epoch + kGolden);
  KeyedPermutation::Keys keys{};
  for (uint64_t& key : keys) {
    state += kGolden;
    key = mix64(state);
  }
  return keys;
}

KeyedPermutation::KeyedPermutation(uint64_t n, const Keys& keys) : n_(n), keys_(keys) {
  if (n == 0) throw std::logic_error("KeyedPermutation: a permutation of no elements");
  const int bits = std::bit_width(n - 1);  // b: n - 1 fits in b bits
  half_bits_ = std::max(1, (bits + 1) / 2);  // h = max(1, ceil(b / 2))
  half_mask_ = (uint64_t{1} << half_bits_) - 1;  // h <= 32, so the shift is defined
}

uint64_t KeyedPermutation::forward_rounds(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t next_right = left ^ round_function(keys_[r], right, half_mask_);
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

uint64_t KeyedPermutation::backward_rounds(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (int r = kRounds - 1; r >= 0; --r) {
    const uint64_t previous_left = right ^ round_function(keys_[r], left, half_mask_);
    right = left;
    left = previous_left;
  }
  return (left << half_bits_) | right;
}

uint64_t KeyedPermutation::operator()(uint64_t index) const {
  if (index >= n_)
    throw std::logic_error("KeyedPermutation: index " + std::to_string(index) + " of " +
                           std::to_string(n_));
  uint64_t x = index;
  do x = forward_rounds(x);
  while (x >= n_);
  return x;
}

uint64_t KeyedPermutation::inverse(uint64_t value) const {
  if (value >= n_)
    throw std::logic_error("KeyedPermutation: value " + std::to_string(value) + " of " +
                           std::to_string(n_));
  uint64_t x = value;
  do x = backward_rounds(x);
  while (x >= n_);
  return x;
}

WindowOrder::WindowOrder(uint64_t num_windows, uint64_t seed)
    : num_windows_(num_windows), seed_(seed) {
  if (num_windows == 0) throw std::logic_error("WindowOrder: no windows to order");
}

KeyedPermutation WindowOrder::epoch(uint64_t epoch) const {
  return KeyedPermutation(num_windows_, epoch_keys(seed_, epoch));
}

}  // namespace llm
