// The order in which an epoch visits the train windows: a keyed bijection of [0, n) computed on
// demand, so the sampler holds a few dozen bytes whatever the corpus (a permutation held as an array
// is 8 bytes per window: 7.8 GB per rank for 10^12 tokens in windows of 1025).
//
// The order is part of a run's replayability (a resumed or replayed run must draw the same windows),
// so it is specified here exactly; tests/window_order_test.cpp holds golden values of it.
//
//   mix64(z)   SplitMix64's output function (Stafford's Mix13), a bijection of 64-bit words:
//                z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
//                z = (z ^ (z >> 27)) * 0x94d049bb133111eb
//                return z ^ (z >> 31)
//   keys       epoch e of seed s has 8 round keys k_0..k_7: the first 8 outputs of SplitMix64 started
//              at state = mix64(s) ^ mix64(e + G), G = 0x9e3779b97f4a7c15 (each output:
//              state += G; k = mix64(state)).
//   domain     h = max(1, ceil(b / 2)) where b is the bit length of n - 1: the smallest domain of
//              an even number of bits, 4^h >= n (at most 4n). x < 4^h splits into L = x >> h and
//              R = x mod 2^h.
//   rounds     8 balanced Feistel rounds: for r = 0..7, (L, R) <- (R, L ^ F(k_r, R)), with
//              F(k, R) = mix64(k ^ R) mod 2^h; then x' = (L << h) | R. A bijection of [0, 4^h).
//   walk       cycle-walking restricts it to [0, n): from index i, apply the rounds until the value
//              is below n. That value is the window at position i; no two positions share one (the
//              walk follows i's cycle of the domain's permutation to the next value below n, and
//              the walk back, inverse(), undoes it). Averaged over an epoch, at most 4 applications
//              of the rounds per position (4^h <= 4n).
//
// Not a uniformly random permutation of n! orders (no 2^64-key family is one, and a Feistel network
// gives only even permutations of its domain); what it guarantees is a bijection, every epoch and seed
// its own order, and the spread that tests/window_order_test.cpp checks (chi-square on positions).
#pragma once

#include <array>
#include <cstdint>

namespace llm {

// One keyed bijection of [0, n): the Feistel rounds and the walk above, with its round keys.
class KeyedPermutation {
 public:
  static constexpr int kRounds = 8;
  using Keys = std::array<uint64_t, kRounds>;

  KeyedPermutation(uint64_t n, const Keys& keys);  // n >= 1

  uint64_t size() const { return n_; }
  uint64_t operator()(uint64_t index) const;  // index < n: the value at that position
  uint64_t inverse(uint64_t value) const;     // value < n: its position; inverse(p(i)) == i

 private:
  uint64_t forward_rounds(uint64_t x) const;
  uint64_t backward_rounds(uint64_t x) const;
  uint64_t n_;
  int half_bits_;       // h: the domain is [0, 4^h)
  uint64_t half_mask_;  // 2^h - 1
  Keys keys_;
};

// The train windows' order of every epoch for one run: epoch(e) is epoch e's permutation.
class WindowOrder {
 public:
  WindowOrder(uint64_t num_windows, uint64_t seed);  // num_windows >= 1

  uint64_t size() const { return num_windows_; }
  KeyedPermutation epoch(uint64_t epoch) const;
  // The window visited at position `index` of `epoch`, and where `window` is visited in `epoch`.
  uint64_t operator()(uint64_t epoch, uint64_t index) const { return this->epoch(epoch)(index); }
  uint64_t position(uint64_t epoch, uint64_t window) const {
    return this->epoch(epoch).inverse(window);
  }

 private:
  uint64_t num_windows_;
  uint64_t seed_;
};

// The pieces of the specification, for the tests and the golden-value script.
uint64_t mix64(uint64_t z);
KeyedPermutation::Keys epoch_keys(uint64_t seed, uint64_t epoch);

}  // namespace llm
