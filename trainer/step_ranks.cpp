#include "trainer/step_ranks.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "memory/categories.h"

namespace llm {

std::optional<Straggler> StragglerWatch::observe(Communicator& communicator, double compute_seconds) {
  const int world = communicator.world_size();
  if (world < 2) return std::nullopt;
  const at::Tensor table = gather_rows(communicator, {static_cast<int64_t>(compute_seconds * 1e6)});
  std::vector<double> step;
  for (int r = 0; r < world; ++r) step.push_back(1e-6 * static_cast<double>(table[r][0].item<int64_t>()));
  window_.push_back(std::move(step));
  if (window_.size() > kStragglerWindow) window_.pop_front();
  if (window_.size() < kStragglerMinSteps) return std::nullopt;

  std::vector<double> per_rank;  // each rank's median over the window
  for (int r = 0; r < world; ++r) {
    std::vector<double> seconds;
    for (const std::vector<double>& logged : window_) seconds.push_back(logged[static_cast<size_t>(r)]);
    per_rank.push_back(median(seconds));
  }
  const int slowest = static_cast<int>(std::max_element(per_rank.begin(), per_rank.end()) - per_rank.begin());
  std::vector<double> others;
  for (int r = 0; r < world; ++r)
    if (r != slowest) others.push_back(per_rank[static_cast<size_t>(r)]);
  const double others_median = median(others);
  const double slow = per_rank[static_cast<size_t>(slowest)];
  if (slow <= kStragglerRatio * others_median || slow - others_median < 1e-3) return std::nullopt;
  return Straggler{communicator.world_ranks()[static_cast<size_t>(slowest)], slow, others_median};
}

}  // namespace llm
