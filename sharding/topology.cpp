#include "sharding/topology.h"

#include <map>

#include "common/errors.h"

namespace llm {

std::vector<ShardTopology> topology_from_hosts(const std::vector<std::string>& hosts, int group_size,
                                               const std::string& flag) {
  const int world = static_cast<int>(hosts.size());
  LLM_REQUIRE(group_size >= 1 && world % group_size == 0, kCommandLine, flag,
              std::to_string(group_size) + " does not divide the " + std::to_string(world) + " ranks");
  // The hosts in the order of their first rank, each with its ranks in world-rank order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks;
  for (int r = 0; r < world; ++r) {
    if (!ranks.count(hosts[static_cast<size_t>(r)])) order.push_back(hosts[static_cast<size_t>(r)]);
    ranks[hosts[static_cast<size_t>(r)]].push_back(r);
  }
  const int per_host = static_cast<int>(ranks.at(order.front()).size());
  for (const std::string& host : order)
    LLM_REQUIRE(static_cast<int>(ranks.at(host).size()) == per_host, kCommandLine, flag,
                "groups of ranks by node need the same number of ranks on every node (" + order.front() + " has " +
                    std::to_string(per_host) + ", " + host + " has " + std::to_string(ranks.at(host).size()) +
                    "): launch as many ranks on each");
  LLM_REQUIRE(per_host % group_size == 0 || group_size % per_host == 0, kCommandLine, flag,
              std::to_string(group_size) + " neither divides the " + std::to_string(per_host) +
                  " ranks of a node nor spans whole nodes (a multiple of " + std::to_string(per_host) +
                  "): a group would straddle nodes unevenly; give a divisor or a multiple of " +
                  std::to_string(per_host));
  // The ranks in host order, each host's in world-rank order: groups are consecutive runs of S.
  std::vector<ShardTopology> topology(static_cast<size_t>(world));
  int position = 0;
  for (const std::string& host : order)
    for (int r : ranks.at(host)) {
      ShardTopology& t = topology[static_cast<size_t>(r)];
      t.world_size = world;
      t.group_size = group_size;
      t.group = position / group_size;
      t.shard = position % group_size;
      ++position;
    }
  return topology;
}

ShardTopology make_topology(const World& world, int group_size, const std::string& flag) {
  return topology_from_hosts(all_gather_text(world.host), group_size, flag).at(static_cast<size_t>(world.rank));
}

int ranks_per_node(const World& world) {
  std::map<std::string, int> counts;
  for (const std::string& host : all_gather_text(world.host)) ++counts[host];
  const int first = counts.begin()->second;
  for (const auto& [host, count] : counts)
    if (count != first) return 0;
  return first;
}

HybridCommunicators split_hybrid(Communicator& world, const ShardTopology& topology) {
  HybridCommunicators split;
  split.group = world.split(topology.group, topology.shard);
  split.across = world.split(topology.shard, topology.group);
  split.group->set_label("group");
  split.across->set_label("across");
  return split;
}

}  // namespace llm
