#!/usr/bin/env bash
# The bytes between nodes, read from the interfaces' own counters (not the trainer's), against the
# formulas of docs/sharding.md, on the namespace cluster (tests/multinode/namespaces.sh): 2 nodes x 2
# ranks, each strategy, the per-step bytes as the difference of a 1-step and a 5-step run (what start-up,
# the first step's one-off work and the end send cancels). Open MPI's collectives are fixed so the
# formulas are the algorithms' (all-gather and all-reduce: ring; reduce-scatter: recursive halving),
# and its shared-memory transport is left out, so the ranks of a node talk over the node's loopback:
# eth0 counts what crosses between nodes, lo what stays inside one, and the two together what every
# rank sent, which the trainer's own count (each step record's "links") must equal.
#
#   bash tests/multinode/link_bytes_test.sh TRAINER MPIEXEC                     (ctest: multinode_link_bytes)
#   bash tests/multinode/link_bytes_test.sh TRAINER MPIEXEC --bench OUT.md [CONFIG]
#       the bench: the same strategies with the link between nodes shaped by tc (1 Gbit/s, 200 Mbit/s),
#       step time and tokens a second beside the bytes, as a markdown table (bench/multinode_links.sh)
source "$(dirname "$0")/../cluster_test_lib.sh" "$1" "$2"
source "$(dirname "$0")/namespaces.sh"
bench_out=""
config=llama_micro
if [ "${3:-}" = "--bench" ]; then
  bench_out=$4
  config=${5:-llama_9m}
fi
cluster_start 10.79.0 2
# across[] without the shared-memory transport, and the collectives' algorithms fixed.
fixed=()
for arg in "${across[@]}"; do fixed+=("${arg/self,tcp,vader/self,tcp}"); done
fixed+=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allgather_algorithm 4
       --mca coll_tuned_allreduce_algorithm 4 --mca coll_tuned_reduce_scatter_block_algorithm 3)
counters() {  # the bytes sent on each node's eth0 and lo, summed over the nodes: "ETH0 LO"
  local eth=0 lo=0 k
  for k in 1 2; do
    eth=$(( eth + $(ip netns exec "trn${tag}_$k" cat /sys/class/net/eth0/statistics/tx_bytes) ))
    lo=$(( lo + $(ip netns exec "trn${tag}_$k" cat /sys/class/net/lo/statistics/tx_bytes) ))
  done
  echo "$eth $lo"
}
run() {  # NAME STEPS SHARDING...: trains; sets grown to the counters' growth "ETH0 LO", wall to its seconds
  local name=$1 steps=$2
  shift 2
  local before after start
  before=$(counters)
  start=$(date +%s.%N)
  timeout 300 "$MPIEXEC" --hostfile "$(hostfile 2 2)" -np 4 "${fixed[@]}" "$TRAINER" \
    --config "$SOURCE/configs/$config.json" --device cpu --max_length 32 --batch_size 2 --total_batch_size 16 \
    --eval_every 0 --eval_batches 1 --warmup_steps 0 --num_training_steps "$steps" "$@" \
    --run_dir "$work/$name" > "$work/$name.log" 2>&1 || fail "$name: $(tail -n 5 "$work/$name.log")"
  wall=$("$PY" -c "import sys, time; print(time.time() - float(sys.argv[1]))" "$start")
  after=$(counters)
  set -- $before $after
  grown="$(( $3 - $1 )) $(( $4 - $2 ))"
}
strategies=("full_shard" "full_shard --backward_gather_size 2" "shard_grad_op" "hybrid_shard --shard_group_size 2"
            "hybrid_shard --shard_group_size 2 --shard_optimizer_across_groups" "hybrid_shard_grad_op --shard_group_size 2")
row_name() {  # STRATEGY: the runs' name, one word
  local name=${1%% *}
  [[ "$1" == *backward_gather* ]] && name=${name}_node_copy
  [[ "$1" == *optimizer_across* ]] && name=${name}_optimizer_across
  [[ "$1" == *"--offload optimizer"* ]] && name=${name}_offload
  [[ "$1" == *"--offload_step speculative"* ]] && name=${name}_speculative
  echo "$name"
}

if [ -z "$bench_out" ]; then
  for strategy in "${strategies[@]}"; do
    name=$(row_name "$strategy")
    run "${name}_1" 1 --sharding $strategy
    short=$grown
    run "${name}_5" 5 --sharding $strategy
    long=$grown
    "$PY" - "$work/${name}_5/metrics.jsonl" "$strategy" $short $long "$work/between" <<'PY' || fail "$name: the bytes between nodes are not the formula's"
import json, statistics, sys
path, strategy = sys.argv[1], sys.argv[2]
short_eth, short_lo, long_eth, long_lo = map(int, sys.argv[3:7])
records = [json.loads(line) for line in open(path)]
state = [r for r in records if r.get("event") == "sharded_state"][0]["ranks"][0]
steps = [r for r in records if r.get("event") == "train"]
B_p, B_g = state["parameter_shard_bytes"], state["gradient_shard_bytes"]
N, nodes, per_node, M = 4, 2, 2, 2  # 4 ranks, 2 nodes of 2, two micro-batches a step
hybrid = strategy.startswith("hybrid")
node_copy = "backward_gather" in strategy
optimizer_across = "optimizer_across" in strategy
S = 2 if hybrid else N
G = N // S
gathers = 1 if "grad_op" in strategy else 2
# Between nodes, a step (docs/sharding.md):
#   full_shard / shard_grad_op, one group over both nodes: the ring all-gather sends (N - 1) shards
#   over each of the ring's `nodes` hops between nodes; recursive halving's reduce-scatter first
#   swaps N/2 shards with the rank N/2 away (on the other node), then stays inside the node.
#   full_shard with the node's copy (--backward_gather_size 2): the backward's gathers stay inside
#   the node, so only the forward's cross.
#   hybrid: a group is a node, so only the all-reduce of the gradient shard across the G groups
#   crosses: every rank sends 2 (G - 1) / G of it (ring). With the optimizer across the groups, a
#   reduce-scatter of the block and an all-gather of the stepped shards (B_g the world shard): the same
#   2 (G - 1) B_g a rank.
if optimizer_across:
    between = N * 2 * (G - 1) * B_g
elif hybrid:
    between = N * 2 * (G - 1) / G * B_g
else:
    crossing_gathers = 1 if node_copy else gathers
    between = crossing_gathers * M * nodes * (N - 1) * B_p + N * (N // 2) * B_g
measured = (long_eth - short_eth) / 4.0
# What every rank sent (eth0 and lo together), against the trainer's own count: rank 0's bytes on
# each link a step, the same on every rank, times the ranks.
counted = N * statistics.median(sum(s["links"][link]["bytes"] for link in ("group", "across", "node")) for s in steps[1:])
sent = (long_eth + long_lo - short_eth - short_lo) / 4.0
print(f"{strategy}: between nodes {measured / 1e3:.1f} kB a step, formula {between / 1e3:.1f} kB "
      f"({measured / between - 1:+.1%}); all ranks sent {sent / 1e3:.1f} kB (eth0 + lo), the trainer counted "
      f"{counted / 1e3:.1f} kB ({sent / counted - 1:+.1%}); model {S * B_p / 1e3:.1f} kB (fp32, padded)")
with open(sys.argv[7], "a") as out:
    out.write(f"{strategy.split()[0]}{'_node_copy' if node_copy else ''}{'_optimizer_across' if optimizer_across else ''} {measured}\n")
# The counters carry each packet's Ethernet, IP and TCP headers (66 B a segment, 4.6 % of a full one),
# the acknowledgements, MPI's own headers and the few scalars a step (the norm, the loss, the
# straggler watch): at most 10 % over. Under: by the noise of subtracting the 1-step run's counters
# from the 5-step run's (start-up and connection traffic differ a little between two runs): 2 % at
# most (hybrid_shard_grad_op once measured 0.6 % under the trainer's count on a loaded machine).
assert 0.98 <= measured / between <= 1.10, (measured, between)
assert 0.98 <= sent / counted <= 1.10, (sent, counted)
PY
  done
  # Hybrid's groups are the nodes: what crosses is the gradient shard's all-reduce, at most 1/S of
  # full_shard's gathers and reduce-scatters (S = 2 here), and no more for accumulation.
  "$PY" - "$work/between" <<'PY' || fail "hybrid sends more between nodes than 1/S of full_shard"
import sys
between = dict((name, float(value)) for name, value in (line.split() for line in open(sys.argv[1])))
for hybrid, flat in (("hybrid_shard", "full_shard"), ("hybrid_shard_grad_op", "shard_grad_op"),
                     ("hybrid_shard_optimizer_across", "full_shard"), ("full_shard_node_copy", "full_shard")):
    ratio = between[hybrid] / between[flat]
    print(f"{hybrid} / {flat} between nodes: {ratio:.3f}")
    assert ratio <= (0.75 if hybrid.endswith("node_copy") else 0.5), ratio
PY
  echo "the bytes between nodes hold each strategy's formula within 10 %, and eth0 + lo the trainer's own count"
  exit 0
fi

# The bench: each node's eth0 shaped (tc's token bucket on its egress, so each direction between the
# nodes runs at RATE), every strategy at each rate, ROUNDS rounds (the median step time is the one
# after the first step; the spread over rounds beside it).
# The bench adds the optimizer offloaded (a CPU has no PCIe: the host step's place and time differ, not
# the bytes), to full_shard and to hybrid, with the host step after backward and speculative in it.
rounds=${ROUNDS:-2}
strategies+=("full_shard --offload optimizer" "hybrid_shard --shard_group_size 2 --offload optimizer"
             "hybrid_shard --shard_group_size 2 --offload optimizer --offload_step speculative")
echo "| link between nodes | strategy | step time s (median over rounds; min-max) | wall-clock s a step | predicted s (trainer estimate) | predicted / measured | tokens/s | MB between nodes a step | s to send them at the rate | MB sent by all ranks (trainer's count) |" > "$bench_out"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" >> "$bench_out"
# The step time `trainer estimate` predicts for each row (memory/step_time.h): the units timed here
# (--profile), each node half of this machine's cores, the collectives as communicator_bench measures
# them with the run's transports and algorithms (--jsonl): inside a node (each node's 2 ranks at once,
# as hybrid's groups run: --group_size 2, once) and spanning the nodes (4 ranks on 2, at each rate),
# from buffers out of the caches; and hybrid's rings across the groups as they run, both of a node's
# ranks in a ring of their own across the nodes at once (--group_size 2 --groups_strided, at each rate).
# Each collective is timed apart (--apart: after a barrier, the mean of 5 iterations), as the run's
# come one at a time (docs/memory.md: back to back, the 16 MiB reduce-scatter across the nodes at
# 200 Mbit/s ran up to 1.5x slower than the same ones inside a run), and each row is the median of
# three probes (launch/median_of_probes.py). The tables are kept beside the bench's table
# (OUT.inside.jsonl, OUT.between_RATE.jsonl, OUT.across_RATE.jsonl). The units are profiled once, for the
# first row's estimate, and every row's estimate prices them so (--profile_cache, kept as OUT.profile.json).
probe() {  # MAX OUT [communicator_bench flags]
  local max=$1 out=$2 k
  shift 2
  for k in 1 2 3; do
    "$MPIEXEC" --hostfile "$(hostfile 2 2)" -np 4 "${fixed[@]}" "$(dirname "$TRAINER")/bench/communicator_bench" \
      --min-bytes 4K --max-bytes "$max" --step-factor 2 --iters 5 --warmup 1 --op average --cold_bytes 64M --apart \
      --jsonl "$out.$k" "$@" > "$out.$k.txt" 2>&1 || fail "communicator_bench $*: $(tail -n 5 "$out.$k.txt")"
  done
  "$PY" "$SOURCE/launch/median_of_probes.py" "$out".{1,2,3} > "$out" || fail "$out: the probes do not merge"
  cp "$out" "$bench_out.$(basename "$out")"
}
probe 64M "$work/inside.jsonl" --group_size 2
predict() {  # RATE SHARDING...: prints the predicted step seconds, or nan
  local gbs rate=$1
  gbs=$(rate_gbs "$rate")
  shift
  "$TRAINER" estimate --config "$SOURCE/configs/$config.json" --device cpu --max_length 32 --batch_size 2 --total_batch_size 16 \
    --world_size 4 --ranks_per_node 2 --host_cores "$(node_cores)" --inter_node_gbs "$gbs" --profile 1 --profile_cache "$work/profile.json" \
    --collective_table "$work/inside.jsonl" --collective_table_between "$work/between_$rate.jsonl" \
    --collective_table_across "$work/across_$rate.jsonl" --json --sharding "$@" 2>/dev/null \
    | "$PY" -c "import json, sys; t = sys.stdin.read(); print(json.loads(t[t.index('{'):])['step_time']['step_seconds'])" \
    || echo nan
}
for rate in 1gbit 200mbit; do
  cluster_shape "$rate"
  probe 16M "$work/between_$rate.jsonl"
  probe 16M "$work/across_$rate.jsonl" --group_size 2 --groups_strided  # hybrid's two rings across at once
  # Round by round: round r of every row before round r + 1 of any, so a drift of the shaped link (the
  # probe's 8 MiB all-reduce across the nodes at 200 Mbit/s moved from 0.998 to 0.921 s between two
  # benches, and 0.88-1.14 s over 14 probes in ten minutes) lands on every row alike, not on one row's
  # runs made back to back.
  for round in $(seq 1 "$rounds"); do
    for strategy in "${strategies[@]}"; do
      name=$(row_name "$strategy")
      # shellcheck disable=SC2086  # the strategy's words are flags
      run "${name}_${rate}_${round}_short" 1 --sharding $strategy
      short=$grown short_wall=$wall
      # shellcheck disable=SC2086
      run "${name}_${rate}_${round}" 5 --sharding $strategy
      echo "$short $grown" > "$work/${name}_${rate}_${round}.bytes"
      echo "$short_wall $wall" > "$work/${name}_${rate}_${round}.wall"
      echo "[bench] $rate, round $round/$rounds: $strategy" >&2
    done
  done
  for strategy in "${strategies[@]}"; do
    name=$(row_name "$strategy")
    # shellcheck disable=SC2086  # the strategy's words are flags
    predicted=$(predict "$rate" $strategy)
    "$PY" - "$work" "$name" "$rate" "$rounds" "$strategy" "$predicted" >> "$bench_out" <<'PY' || fail "$name at $rate: no table row"
import json, statistics, sys
work, name, rate, rounds, strategy = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
predicted = float(sys.argv[6])
times, walls, rates, between, counted = [], [], [], [], []
for r in range(1, rounds + 1):
    steps = [json.loads(l) for l in open(f"{work}/{name}_{rate}_{r}/metrics.jsonl")]
    steps = [s for s in steps if s.get("event") == "train"][1:]
    times.append(statistics.median(s["step_time_s"] for s in steps))
    rates.append(statistics.median(s["tokens_per_s"] for s in steps))
    counted.append(4 * statistics.median(sum(s["links"][k]["bytes"] for k in ("group", "across", "node")) for s in steps))
    short_eth, _, long_eth, _ = map(int, open(f"{work}/{name}_{rate}_{r}.bytes").read().split())
    between.append((long_eth - short_eth) / 4.0)
    # From outside the trainer: the 5-step run's wall-clock less the 1-step run's, over the 4 steps more.
    short_wall, long_wall = map(float, open(f"{work}/{name}_{rate}_{r}.wall").read().split())
    walls.append((long_wall - short_wall) / 4.0)
bits = {"1gbit": 1e9, "200mbit": 2e8}[rate]
# Both directions run at the rate at once: the busier node's half of the bytes sets the time.
wire = statistics.median(between) / 2 * 8 / bits
print(f"| {rate.replace('gbit', ' Gbit/s').replace('mbit', ' Mbit/s')} | {strategy} | {statistics.median(times):.3f} "
      f"({min(times):.3f}-{max(times):.3f}) | {statistics.median(walls):.3f} | {predicted:.3f} | {predicted / statistics.median(times):.2f} | "
      f"{statistics.median(rates):.0f} | {statistics.median(between) / 1e6:.2f} | "
      f"{wire:.3f} | {statistics.median(counted) / 1e6:.2f} |")
PY
  done
done
cp "$work/profile.json" "$bench_out.profile.json"
echo "wrote $bench_out"
