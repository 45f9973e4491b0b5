// Hybrid sharding's groups (--sharding hybrid_shard, hybrid_shard_grad_op): N ranks in G = N / S groups
// of S. A unit is sharded inside its group (full_shard or shard_grad_op over the group's communicator)
// and replicated across the groups; each rank's gradient shard is all-reduced with the ranks that hold
// the same shard in the other groups (the "across" communicator), once per optimizer step.
//
// Groups are made from the hosts, not from rank numbers: the ranks of one host, in world-rank order,
// cut into runs of S (S dividing the ranks per host), or S spanning whole hosts (a multiple of them).
// So a group stays inside a node whatever the launcher's placement (mpirun --map-by node, srun -m
// cyclic put consecutive ranks on different nodes), which is what makes the gathers and
// reduce-scatters local and only the replicas' all-reduce cross the nodes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "sharding/communicator.h"
#include "sharding/world.h"

namespace llm {

// --shard_optimizer_across_groups lays the optimizer out over the world: the rank at place k of group
// g (of G groups) holds world shard k G + g, so the S blocks of G consecutive world shards, one per place
// in a group, are the N shards in world order (sharding/fsdp_unit.h).
inline int world_shard_index(int shard, int group, int groups) { return shard * groups + group; }

struct ShardTopology {
  int world_size = 1;
  int group_size = 1;  // S
  int group = 0;       // g: this rank's group, 0 .. G - 1
  int shard = 0;       // k: its position in the group, the shard it holds
  int groups() const { return world_size / group_size; }
  int world_shard() const { return world_shard_index(shard, group, groups()); }
};

// Every rank's (group, shard) from every rank's host, in world-rank order (the rule above). UserError
// naming --shard_group_size when the hosts hold different numbers of ranks, or S neither divides the
// ranks per host nor is a multiple of them.
// `flag`: the flag that set the size, for the messages.
std::vector<ShardTopology> topology_from_hosts(const std::vector<std::string>& hosts, int group_size,
                                               const std::string& flag = "--shard_group_size");
// This rank's, from the hosts of every rank (all_gather_text: collective over the world).
ShardTopology make_topology(const World& world, int group_size, const std::string& flag = "--shard_group_size");

// The ranks of `world` per node when every node has the same number, else 0 (collective).
int ranks_per_node(const World& world);

struct HybridCommunicators {
  std::unique_ptr<Communicator> group;   // this rank's group, ordered by shard; labelled "group"
  std::unique_ptr<Communicator> across;  // the ranks holding the same shard, ordered by group; "across"
};
// Splits `world` (collective over it): group = color g, key k; across = color k, key g.
HybridCommunicators split_hybrid(Communicator& world, const ShardTopology& topology);

}  // namespace llm
