// --sharding hybrid_* and --shard_group_size against the world size (config/config.h).
#include <string>

#include "common/errors.h"
#include "config/config.h"

namespace llm {

namespace {

// "1, 2, 4": the divisors of n up to `most`, for the messages.
std::string divisors_text(int n, int most) {
  std::string divisors;
  for (int d = 1; d <= most; ++d)
    if (n % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
  return divisors;
}

// --backward_gather_size: full_shard's node-local copy for the backward gathers.
void check_backward_gather(const RunConfig& run, int world_size) {
  const int size = run.sharding.backward_gather_size;
  if (size == 0) return;
  const std::string flag = "--backward_gather_size";
  if (run.sharding.strategy != ShardingStrategy::full_shard)
    fail_user(kCommandLine, flag,
              std::string("keeps a copy of each unit's rows over a node between its forward and backward for "
                          "full_shard's backward gathers, and --sharding is ") +
                  to_string(run.sharding.strategy) +
                  ": shard_grad_op and no_shard do not gather in the backward, and hybrid_shard's gathers are "
                  "inside its group already; pass --sharding full_shard, or leave it out");
  if (offloads_parameters(run.sharding.offload))
    fail_user(kCommandLine, flag,
              "with --offload parameters the rows a backward gathers come from host memory; a copy kept on "
              "the device between forward and backward would undo the offload: use one or the other");
  if (size < 1)
    fail_user(kCommandLine, flag, "must be at least 1 (got " + std::to_string(size) + "); 0 turns it off");
  if (world_size % size != 0 || size >= world_size) {
    const std::string divisors = divisors_text(world_size, world_size - 1);
    fail_user(kCommandLine, flag,
              std::to_string(size) + (size >= world_size ? " is not below the " : " does not divide the ") +
                  std::to_string(world_size) + " ranks" +
                  (divisors.empty() ? ": one rank gathers nothing; leave it out"
                                    : ": give a divisor below the world size (" + divisors + "), the ranks of one node"));
  }
}

// --shard_optimizer_across_groups: hybrid's, and not yet with what moves the optimizer to the host.
void check_optimizer_across_groups(const RunConfig& run) {
  if (!run.sharding.optimizer_across_groups) return;
  const std::string flag = "--shard_optimizer_across_groups";
  if (!is_hybrid(run.sharding.strategy))
    fail_user(kCommandLine, flag,
              std::string("splits a hybrid group's optimizer rows over the groups, and --sharding is ") +
                  to_string(run.sharding.strategy) +
                  (run.sharding.strategy == ShardingStrategy::no_shard
                       ? ": pass --sharding hybrid_shard, or leave it out"
                       : ": full_shard and shard_grad_op shard the optimizer over every rank already; leave it out"));
}

}  // namespace

void check_sharding_topology(const RunConfig& run, int world_size) {
  check_backward_gather(run, world_size);
  check_optimizer_across_groups(run);
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
  fail_user(kCommandLine, "--shard_group_size",
            std::to_string(group) + " does not divide the " + std::to_string(world_size) + " ranks into groups of " +
                "equal size: give a divisor of " + std::to_string(world_size) + " (" + divisors_text(world_size, world_size) +
                "); the default is the ranks of one node");
}

}  // namespace llm
