// Collectives as measured, for the step-time model (memory/step_time.h): `trainer estimate
// --collective_table FILE` reads the rows `build/bench/communicator_bench --jsonl FILE` writes (one
// JSON object a line: collective, bytes, ranks, seconds, ...), and a collective inside a node takes
// the table's time at its size instead of the ring model's bandwidth and latency;
// --collective_table_between FILE likewise for the collectives whose ranks span nodes (a probe over
// ranks on several nodes), hybrid's rings across the groups `ranks per node` times over, as that many
// share the node's link at once.
//
// Why a table and not one bandwidth: on the 2-core CI machine, 4 ranks over MPI's shared memory
// reduce-scatter 1 MiB at 2.8 GB/s of bus bandwidth and 16 MiB at 0.37 (the sum runs from memory, not
// cache, and 4 ranks take turns on 2 cores), so llama_9m's 16 MiB embedding and head took 35 ms
// each where one bandwidth said 5. nccl-tests tables vary with size as much on GPUs.
//
// The lookup, for a collective of `bytes` (nccl-tests' size: the gathered output of an all-gather,
// the input of a reduce-scatter, the tensor of an all-reduce) over n ranks:
//   between two measured sizes   the time is interpolated on a log-log line (a power law between them);
//   below the smallest           the smallest's time (latency-bound);
//   above the largest            the largest's time scaled by bytes (bandwidth-bound);
//   n other than the table's     the bus bandwidth is kept: time x [(n - 1) / n] / [(N - 1) / N]
//                                (2 (n - 1) / n for an all-reduce; the same ratio), 0 for n = 1.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace llm {

struct CollectiveTable {
  struct Row {
    double bytes = 0, seconds = 0;
  };
  int ranks = 0;                                  // the ranks the rows were measured over
  std::map<std::string, std::vector<Row>> rows;  // by collective, sorted by bytes
  std::string source;                            // "FILE: 4 ranks, all_gather 4096-67108864 B, ..."

  // Seconds for `collective` of `bytes` over `ranks` ranks; none when the table has no row of it.
  std::optional<double> seconds(const std::string& collective, double bytes, int ranks) const;
};

// Reads communicator_bench's JSON lines; a bad file, line or row is a UserError naming the file, the
// line and the field. Cached by path: --fit asks for it once per candidate.
const CollectiveTable& load_collective_table(const std::string& path, const std::string& flag = "--collective_table");
CollectiveTable parse_collective_table(const std::string& text, const std::string& path);

}  // namespace llm
