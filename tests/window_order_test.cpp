// The window order (data/window_order.h): the specification's golden values, a bijection of [0, n)
// for every n up to 2000 and at the edges of the Feistel domain (checked exhaustively), an exact
// inverse on samples of domains up to 2^64 - 1, an order of its own for every epoch and seed, and
// positions spread as a random permutation's would be (chi-square bounds).
//
// Why the large domains are checked through the inverse: a repeat among 10^6 draws of a 10^12 domain
// is what a random *function* shows with probability 1 - e^(-1/2) = 39% only, so "no repeats" alone
// proves little. A map of [0, n) into [0, n) with a left inverse is injective, hence a bijection;
// the test checks position(p(i)) == i and p(position(v)) == v on samples, which catches a wrong
// width, mask or shift at that size (the code paths are the same for every n, and the exhaustive
// checks cover them at small widths), and the construction (Feistel rounds, cycle-walking) makes the
// inverse exact everywhere.
//
// The statistical bounds are the chi-square quantiles at p = 1e-6, with fixed seeds: the test is
// deterministic, and a keyed permutation that spreads as it should passes each with probability
// 1 - 1e-6 (sampling without replacement only lowers the statistic).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "data/window_order.h"

namespace llm::window_order_test {
namespace {

struct GoldenCase {
  uint64_t n, seed, epoch;
  std::vector<uint64_t> first_windows;  // the windows at positions 0, 1, ...
};

// Printed by tests/golden/window_order_reference.py (the specification in Python). A change here is a
// change of every run's data order: replays of older runs would read other windows.
const std::vector<GoldenCase>& golden_cases() {
  static const std::vector<GoldenCase> cases = {
      {10ULL, 1234, 0, {3, 2, 9, 6, 7, 5, 1, 8, 4, 0}},
      {10ULL, 1234, 1, {6, 5, 7, 8, 2, 3, 4, 1, 0, 9}},
      {1000ULL, 0, 0, {657, 965, 591, 644, 787, 123, 251, 374}},
      {1048576ULL, 42, 3, {849102, 1024678, 1016826, 731645, 46461, 485061, 618657, 886227}},
      {975609756ULL, 1234, 0,
       {122795774, 320084222, 924268352, 236082631, 564578619, 246524648, 352928276, 762513027}},
      {1000000000000ULL, 7, 2,
       {580950133803, 130361761274, 18620000710, 56513037995, 364860618522, 983309704158,
        902801636387, 267328706149}},
      {18446744073709551615ULL, 1, 0,
       {13269840050564426923ULL, 11119492743792739058ULL, 995702759927310600ULL,
        17913349117502336128ULL}},
  };
  return cases;
}

TEST(WindowOrder, MatchesTheSpecificationsGoldenValues) {
  EXPECT_EQ(mix64(0x0123456789abcdefULL), 0xb2c058e4ebb5112cULL);
  EXPECT_EQ(mix64(0x9e3779b97f4a7c15ULL), 0xe220a8397b1dcdafULL);  // SplitMix64's first output from 0
  const KeyedPermutation::Keys keys = {0xc554fc8be8ffa223ULL, 0xa27d01f916a798c2ULL,
                                       0x0f326dd0b131530dULL, 0x3fb3c2509e228bfaULL,
                                       0x990a3b287baf7e43ULL, 0x70db5ccdcd850dbaULL,
                                       0x61af1c6618ac933dULL, 0x0284d5352036604eULL};
  EXPECT_EQ(epoch_keys(1234, 5), keys);
  for (const GoldenCase& golden : golden_cases()) {
    const WindowOrder order(golden.n, golden.seed);
    for (size_t i = 0; i < golden.first_windows.size(); ++i)
      EXPECT_EQ(order(golden.epoch, i), golden.first_windows[i])
          << "n " << golden.n << " seed " << golden.seed << " epoch " << golden.epoch
          << " position " << i;
  }
}

// Every value below n once, and position() its inverse.
void expect_exhaustive_bijection(uint64_t n, uint64_t seed, uint64_t epoch) {
  const KeyedPermutation permutation = WindowOrder(n, seed).epoch(epoch);
  std::vector<bool> seen(n, false);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t value = permutation(i);
    ASSERT_LT(value, n) << "n " << n << " position " << i;
    ASSERT_FALSE(seen[value]) << "n " << n << ": window " << value << " visited twice";
    seen[value] = true;
    ASSERT_EQ(permutation.inverse(value), i) << "n " << n;
  }
}

TEST(WindowOrder, IsABijectionForEveryNUpTo2000) {
  for (uint64_t n = 1; n <= 2000; ++n) {
    expect_exhaustive_bijection(n, n * 31 + 7, 0);
    expect_exhaustive_bijection(n, n * 31 + 7, n % 5 + 1);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_THROW(WindowOrder(0, 1), std::logic_error);
  EXPECT_THROW(WindowOrder(10, 1)(0, 10), std::logic_error);
}

// Where the domain 4^h changes (n = 4^k is the largest n of its domain, 4^k + 1 the smallest of the
// next, at 4n), and odd powers of two, up to a million windows.
TEST(WindowOrder, IsABijectionAtTheEdgesOfTheFeistelDomain) {
  for (int k = 6; k <= 10; ++k) {
    const uint64_t power = uint64_t{1} << (2 * k);
    for (uint64_t n : {power - 1, power, power + 1, power / 2, power / 2 + 1}) {
      expect_exhaustive_bijection(n, 2024, static_cast<uint64_t>(k));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(WindowOrder, InvertsExactlyOnLargeDomains) {
  std::mt19937_64 generator(11);
  for (uint64_t n : {uint64_t{975609756}, uint64_t{1000000000000}, (uint64_t{1} << 40) + 1,
                     (uint64_t{1} << 62) + 3, ~uint64_t{0}}) {
    const KeyedPermutation permutation = WindowOrder(n, 99).epoch(4);
    std::vector<uint64_t> indices = {0, 1, n / 2, n - 2, n - 1};
    for (int draw = 0; draw < 20000; ++draw) indices.push_back(generator() % n);
    for (uint64_t index : indices) {
      const uint64_t value = permutation(index);
      ASSERT_LT(value, n) << "n " << n << " position " << index;
      ASSERT_EQ(permutation.inverse(value), index) << "n " << n;
      ASSERT_EQ(permutation(permutation.inverse(index)), index) << "n " << n;  // index as a value
    }
  }
}

// Necessary, not sufficient (see the top): the first million positions of a 10^12-window epoch, the
// ones a run reads first, name a million different windows.
TEST(WindowOrder, FirstMillionPositionsOfATrillionWindowsAreDistinct) {
  const KeyedPermutation permutation = WindowOrder(1000000000000ULL, 5).epoch(0);
  std::vector<uint64_t> windows(1000000);
  for (uint64_t i = 0; i < windows.size(); ++i) windows[i] = permutation(i);
  std::sort(windows.begin(), windows.end());
  EXPECT_EQ(std::adjacent_find(windows.begin(), windows.end()), windows.end());
}

// Positions where two orders of n windows agree: a Poisson(1) count for independent random orders.
int agreements(const KeyedPermutation& a, const KeyedPermutation& b) {
  int same = 0;
  for (uint64_t i = 0; i < a.size(); ++i) same += a(i) == b(i) ? 1 : 0;
  return same;
}

TEST(WindowOrder, EveryEpochAndSeedHasItsOwnOrder) {
  // 10 epochs of one seed, 10 seeds of one epoch, and (seed, epoch) against (epoch, seed): no pair of
  // orders of 1000 windows agrees at more than 10 positions (P(Poisson(1) > 10) = 1e-8 a pair).
  const uint64_t n = 1000;
  std::vector<KeyedPermutation> orders;
  for (uint64_t epoch = 0; epoch < 10; ++epoch) orders.push_back(WindowOrder(n, 1).epoch(epoch));
  for (uint64_t seed = 2; seed < 12; ++seed) orders.push_back(WindowOrder(n, seed).epoch(0));
  orders.push_back(WindowOrder(n, 3).epoch(7));
  orders.push_back(WindowOrder(n, 7).epoch(3));
  for (size_t a = 0; a < orders.size(); ++a)
    for (size_t b = a + 1; b < orders.size(); ++b)
      EXPECT_LE(agreements(orders[a], orders[b]), 10) << "orders " << a << " and " << b;
  // A small corpus: 200 epochs of 10 windows are 200 different orders (10! = 3628800 exist; a
  // repeat among 200 uniform draws has probability 0.5%, and a fixed seed makes the test exact).
  std::set<std::vector<uint64_t>> distinct;
  const WindowOrder small(10, 1234);
  for (uint64_t epoch = 0; epoch < 200; ++epoch) {
    std::vector<uint64_t> order;
    for (uint64_t i = 0; i < 10; ++i) order.push_back(small(epoch, i));
    distinct.insert(order);
  }
  EXPECT_EQ(distinct.size(), 200u);
}

// Pearson's statistic of `counts` against equal expected counts.
double chi_square(const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t count : counts) total += count;
  const double expected = static_cast<double>(total) / static_cast<double>(counts.size());
  double statistic = 0;
  for (int64_t count : counts) statistic += (count - expected) * (count - expected) / expected;
  return statistic;
}

// Chi-square quantiles at p = 1e-6 for 9, 19 and 99 degrees of freedom.
constexpr double kChiSquare9 = 44.81, kChiSquare19 = 63.68, kChiSquare99 = 180.79;

TEST(WindowOrder, PositionsSpreadOverTheEpoch) {
  for (uint64_t n : {uint64_t{1000000}, uint64_t{1025}, uint64_t{1000000000000}}) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{77}}) {
      const KeyedPermutation permutation = WindowOrder(n, seed).epoch(seed + 1);
      const uint64_t draws = std::min<uint64_t>(n / 4, 10000);  // a quarter: all n would be exact
      // Where the first windows of the corpus fall in the epoch, and which windows the epoch's first
      // positions read: both over 20 equal bins of [0, n).
      std::vector<int64_t> positions(20, 0), windows(20, 0);
      // Consecutive positions: (bin of p(i), bin of p(i + 1)) over 10 x 10 bins, so an order that
      // walks the corpus in runs (p(i + 1) near p(i)) fails.
      std::vector<int64_t> pairs(100, 0);
      auto bin = [n](uint64_t value, uint64_t bins) {
        return static_cast<size_t>(static_cast<unsigned __int128>(value) * bins / n);
      };
      for (uint64_t i = 0; i < draws; ++i) {
        ++positions[bin(permutation.inverse(i), 20)];
        ++windows[bin(permutation(i), 20)];
        if (i + 1 < draws) ++pairs[bin(permutation(i), 10) * 10 + bin(permutation(i + 1), 10)];
      }
      EXPECT_LT(chi_square(positions), kChiSquare19) << "n " << n << " seed " << seed;
      EXPECT_LT(chi_square(windows), kChiSquare19) << "n " << n << " seed " << seed;
      if (draws >= 10000) {
        EXPECT_LT(chi_square(pairs), kChiSquare99) << "n " << n << " seed " << seed;
      }
    }
  }
}

// Across epochs (the keys, not the rounds, vary): where window 0 lands, and which window comes
// first, over 20000 epochs of 1025 windows (the largest walk: 4^6 = 4096 domain values for 1025).
TEST(WindowOrder, EachWindowLandsAnywhereAcrossEpochs) {
  const uint64_t n = 1025;
  const WindowOrder order(n, 3);
  std::vector<int64_t> landing(10, 0), first(10, 0);
  for (uint64_t epoch = 0; epoch < 20000; ++epoch) {
    const KeyedPermutation permutation = order.epoch(epoch);
    ++landing[permutation.inverse(0) * 10 / n];
    ++first[permutation(0) * 10 / n];
  }
  EXPECT_LT(chi_square(landing), kChiSquare9);
  EXPECT_LT(chi_square(first), kChiSquare9);
}

}  // namespace
}  // namespace llm::window_order_test
