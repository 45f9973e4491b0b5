// --sharding hybrid_* and --shard_group_size against the world size (config/config.h).
#include <string>

#include "common/errors.h"
#include "config/config.h"

namespace llm {

void check_sharding_topology(const RunConfig& run, int world_size) {
  const int group = run.sharding.group_size;
  const std::string strategy = to_string(run.sharding.strategy);
  if (!is_hybrid(run.sharding.strategy)) {
    if (group != 0)
      fail_user(kCommandLine, "--shard_group_size",
                "sets the group of a hybrid strategy, and --sharding is " + strategy +
                    ": pass --sharding hybrid_shard (or hybrid_shard_grad_op), or leave it out");
    return;
  }
  if (group < 1)  // main resolves the default before validation; a config file or a caller that did not
    fail_user(kCommandLine, "--shard_group_size", "must be at least 1 (got " + std::to_string(group) + ")");
  if (world_size % group == 0) return;
  std::string divisors;
  for (int d = 1; d <= world_size; ++d)
    if (world_size % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
  fail_user(kCommandLine, "--shard_group_size",
            std::to_string(group) + " does not divide the " + std::to_string(world_size) + " ranks into groups of " +
                "equal size: give a divisor of " + std::to_string(world_size) + " (" + divisors +
                "); the default is the ranks of one node");
}

}  // namespace llm
