#!/usr/bin/env bash
# Hybrid sharding against full_shard between nodes: the namespace cluster (tests/multinode), 2 nodes x 2
# ranks, the link between the nodes shaped by tc to 1 Gbit/s and to 200 Mbit/s, each strategy side by
# side in one run: step time beside `trainer estimate`'s predicted step (issue 54), tokens a second, and
# the bytes that explain them (between nodes from the interfaces' counters, all ranks' from the
# trainer's own count). Needs root (network namespaces).
#   bash bench/multinode_links.sh [OUT.md] [CONFIG]     (default docs/bench/multinode_links.md, llama_9m)
#   ROUNDS=3 bash bench/multinode_links.sh ...          (rounds per row; default 2)
set -eu
cd "$(dirname "$0")/.."
out=${1:-docs/bench/multinode_links.md}
config=${2:-llama_9m}
table=$(mktemp)
# The tree the bench runs (before it writes its own table, which would read as a change).
dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo " with uncommitted changes" || true)
bash tests/multinode/link_bytes_test.sh build/trainer "${MPIEXEC:-mpirun}" --bench "$table" "$config"
{
  echo "# Hybrid sharding between nodes: bench/multinode_links.sh"
  echo
  echo "Made $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD)$dirty on this machine ($(nproc --all) cores), $config,"
  echo "4 ranks on 2 namespace nodes (tests/multinode), micro-batch 2 x 32 tokens, 2 micro-batches a step,"
  echo "${ROUNDS:-2} rounds a row, run round by round (round r of every row at a rate before round r + 1 of any)."
  echo "Step time and tokens/s: the trainer's step records, the median over the steps"
  echo "after the first, then over the rounds (min-max beside). Wall-clock a step, from outside the trainer: the 5-step"
  echo "run's time less the 1-step run's, over 4 (start-up, the first step and the end cancel), the median over the rounds."
  echo "The optimizer offloaded (\`--offload optimizer\`, the host step after backward or \`--offload_step speculative\` in it):"
  echo "on a CPU the same bytes; the host step's place and time differ. Bytes between nodes: both nodes' eth0 counters"
  echo "over a 5-step run less a 1-step one, a step; the time to send them: the busier direction's half at the"
  echo "rate. All ranks' bytes: the trainer's count (docs/sharding.md has the formulas both follow). Predicted:"
  echo "\`trainer estimate --profile 1\` for the row's flags (memory/step_time.h), the units profiled once for every row (\`--profile_cache\`,"
  echo "kept as multinode_links.profile.json), each node half of this machine's"
  echo "cores, the collectives at the times \`communicator_bench --jsonl\` measured with the run's transports and"
  echo "algorithms: each node's 2 ranks at once (\`--collective_table\`, \`--group_size 2\`), 4 ranks across the 2 nodes at the row's rate"
  echo "(\`--collective_table_between\`), and hybrid's two rings across the nodes at once at the row's rate (\`--collective_table_across\`,"
  echo "\`--group_size 2 --groups_strided\`), 4 KiB to 64 MiB and 16 MiB, from buffers out of the caches, each collective"
  echo "timed apart (\`--apart\`: after a barrier, the mean of 5), as the run's come one at a time, each row"
  echo "the median of 3 probes; the tables are kept beside this file (multinode_links.inside.jsonl, .between_RATE, .across_RATE)."
  echo
  cat "$table"
} > "$out"
for kept in "$table".*.jsonl "$table".profile.json; do mv "$kept" "${out%.md}.${kept#"$table".}"; done  # the probes' tables, the profile
rm -f "$table"
echo "wrote $out and its probes' tables (${out%.md}.*.jsonl)"
