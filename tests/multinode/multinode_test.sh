#!/usr/bin/env bash
# Several nodes on this one machine: each "node" is a Linux network namespace joined to the others by a
# bridge and veth links (10.78.0.K/24), with a host name of its own (a UTS namespace), and Open MPI
# starts its daemons in them through a launch agent that enters the namespace in place of ssh
# (tests/multinode/agent.sh), so `mpirun --hostfile` runs ranks on different nodes that talk over TCP.
#   1. 2 nodes x 2 ranks: every step equal to 1 node x 4 ranks bitwise; the memory record groups the
#      ranks by node ([0,1], [2,3]);
#   2. a checkpoint written by 2 nodes resumes on 1 node and on 3, and ends within 1e-5 of the
#      uninterrupted run's loss (other world sizes sum in another order);
#   3. SIGTERM to launch/mpirun.sh preempts every node: each rank saves at the next step boundary,
#      exit 0, and the job resumes from that checkpoint.
#
#   bash tests/multinode/multinode_test.sh TRAINER MPIEXEC    (ctest: multinode_namespaces)
#
# Needs root (ip netns, unshare): exit 77 (ctest's skip) naming what is missing otherwise.
source "$(dirname "$0")/../cluster_test_lib.sh" "$1" "$2"
source "$(dirname "$0")/namespaces.sh"
cluster_start 10.78.0 3

# The same, with a folder of the node's own at $work/private (a mount namespace with a tmpfs there): a
# --run_dir no other node sees. And as ssh to a machine that lost its power does, the agent does not
# end when the node's processes are killed (ssh would wait for its connection's timeout, minutes):
# mpirun learns nothing from it.
mkdir -p "$work/private"
cat > "$work/agent_private.sh" <<AGENT
#!/usr/bin/env bash
host=\$1; shift
k=\${host##*.}
ip netns exec trn${tag}_\$k unshare --uts --mount sh -c "hostname node\$k; mount -t tmpfs tmpfs $work/private; \$*" &
wait \$!
status=\$?
[ "\$status" -eq 137 ] && exec -a "lost-node-agent-$tag" sleep 600  # killed with the node: the "connection" stays
exit "\$status"
AGENT
chmod +x "$work/agent_private.sh"
flags=(--config "$SOURCE/configs/llama_micro.json" --device cpu --max_length 16 --total_batch_size 12
       --eval_every 0 --eval_batches 1 --warmup_steps 2 --lr 1e-2)

# 1. Two nodes of two ranks against one node of four.
"$MPIEXEC" --oversubscribe -np 4 "$TRAINER" "${flags[@]}" --batch_size 3 --num_training_steps 6 \
  --run_dir "$work/one_node" > "$work/one_node.log" 2>&1 || fail "mpirun -np 4: $(tail -n 3 "$work/one_node.log")"
timeout 120 "$MPIEXEC" --hostfile "$(hostfile 2 2)" -np 4 "${across[@]}" "$TRAINER" "${flags[@]}" --batch_size 3 \
  --num_training_steps 6 --run_dir "$work/two_nodes" --save_dir "$work/ckpt" --save_every 3 > "$work/two_nodes.log" 2>&1 \
  || fail "mpirun across 2 nodes: $(tail -n 5 "$work/two_nodes.log")"
[ "$(records "$work/one_node/metrics.jsonl")" = "$(records "$work/two_nodes/metrics.jsonl")" ] \
  || fail "2 nodes x 2 ranks differ from 1 node x 4 ranks"
"$PY" - "$work/two_nodes/metrics.jsonl" <<'PY' || fail "the memory record does not group the ranks by node"
import json, sys
memory = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "memory"][-1]
nodes = sorted(n["ranks"] for n in memory["nodes"])
assert nodes == [[0, 1], [2, 3]], nodes
PY
# The start-up memory check adds up each node's ranks against that node's memory.
grep -q "per node (2 rank(s) on this one)" "$work/two_nodes.log" || fail "the memory check did not count 2 ranks a node: $(grep 'memory check' "$work/two_nodes.log")"
grep -q "per node (4 rank(s) on this one)" "$work/one_node.log" || fail "the memory check did not count 4 ranks on one node: $(grep 'memory check' "$work/one_node.log")"
echo "2 nodes x 2 ranks over TCP: 6 steps, the same bits as 1 node x 4 ranks; ranks by node [0,1] [2,3]; the memory check counts 2 ranks a node"

# 2. The step-3 checkpoint of 2 nodes, resumed on 1 node (2 ranks) and on 3 nodes (1 rank each).
final() { "$PY" -c "
import json, sys
print([r for r in map(json.loads, open(sys.argv[1])) if r.get('event') == 'train'][-1]['loss'])" "$1"; }
for case in "1 2 6" "3 1 4"; do
  set -- $case
  timeout 120 "$MPIEXEC" --hostfile "$(hostfile "$1" "$2")" -np $(( $1 * $2 )) "${across[@]}" "$TRAINER" "${flags[@]}" \
    --batch_size "$3" --num_training_steps 6 --continue_from "$work/ckpt/step_3" --run_dir "$work/resumed_$1" \
    > "$work/resumed_$1.log" 2>&1 || fail "resume on $1 node(s): $(tail -n 5 "$work/resumed_$1.log")"
  "$PY" -c "
import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)" "$(final "$work/resumed_$1/metrics.jsonl")" "$(final "$work/one_node/metrics.jsonl")" \
    || fail "resumed on $1 node(s): final loss $(final "$work/resumed_$1/metrics.jsonl"), uninterrupted $(final "$work/one_node/metrics.jsonl")"
  echo "the 2-node checkpoint resumed on $1 node(s) x $2 rank(s): final loss $(final "$work/resumed_$1/metrics.jsonl") (uninterrupted $(final "$work/one_node/metrics.jsonl"))"
done

# 3. SIGTERM to launch/mpirun.sh: every node saves and exits 0.
MPIEXEC="$MPIEXEC" bash "$SOURCE/launch/mpirun.sh" --hostfile "$(hostfile 2 2)" -np 4 "${across[@]}" "$TRAINER" "${flags[@]}" \
  --batch_size 3 --num_training_steps 100000 --run_dir "$work/preempted" --save_dir "$work/ckpt_preempted" \
  > "$work/preempted.log" 2>&1 &
launcher=$!
for _ in $(seq 1 300); do
  n=$(grep -c '"event":"train"' "$work/preempted/metrics.jsonl" 2>/dev/null)
  [ "${n:-0}" -ge 3 ] && break
  sleep 0.1
done
kill -TERM "$launcher"
wait "$launcher"
status=$?
[ "$status" -eq 0 ] || fail "launch/mpirun.sh ended with $status after SIGTERM: $(tail -n 5 "$work/preempted.log")"
grep -q '"event":"preempted"' "$work/preempted/metrics.jsonl" || fail "no preempted record"
saved=$(ls -d "$work"/ckpt_preempted/step_* 2>/dev/null | head -n 1)
[ -n "$saved" ] || fail "nothing saved after SIGTERM"
# The save is whole (every rank's part): the job resumes from it on the same 2 nodes.
timeout 120 "$MPIEXEC" --hostfile "$(hostfile 2 2)" -np 4 "${across[@]}" "$TRAINER" "${flags[@]}" --batch_size 3 \
  --num_training_steps $(( ${saved##*_} + 1 )) --continue_from "$work/ckpt_preempted" --run_dir "$work/preempted" \
  > "$work/after_preemption.log" 2>&1 || fail "the resume after SIGTERM: $(tail -n 5 "$work/after_preemption.log")"
grep -q "resumed from $saved" "$work/after_preemption.log" || fail "the resume did not start from $saved"
echo "SIGTERM to launch/mpirun.sh across 2 nodes: every rank saved $(basename "$saved"), exit 0; resumed from it"

# 4. A node disappears (its link cut, then every process on it killed: no connection is closed, as when
#    a machine loses power). The stall watchdog of the ranks left, each node with its own --run_dir,
#    names the lost node's ranks and ends them with exit status 4 within the timeout, and the job
#    ends with it: mpirun runs on a launch node of its own whose TCP gives up on an unanswered peer
#    after 3 retransmissions (net.ipv4.tcp_retries2=3, that namespace only; Linux's default 15 would
#    keep mpirun waiting on the lost node's daemon for about 15 minutes: docs/multinode.md).
launcher_ns=trn${tag}_0
cluster_node 0 10.78.0.250
ip netns exec "$launcher_ns" sysctl -q -w net.ipv4.tcp_retries2=3 || skip "cannot set a namespace's net.ipv4.tcp_retries2 here"
private=(--mca plm_rsh_agent "$work/agent_private.sh" --mca oob_tcp_if_include 10.78.0.0/24
         --mca btl_tcp_if_include 10.78.0.0/24 --mca btl self,tcp,vader -x OMP_NUM_THREADS)
ip netns exec "$launcher_ns" "$MPIEXEC" --hostfile "$(hostfile 2 2)" -np 4 "${private[@]}" "$TRAINER" "${flags[@]}" \
  --batch_size 3 --num_training_steps 100000 --collective_timeout 5 --run_dir "$work/private/run" \
  > "$work/lost_node.log" 2>&1 &
job=$!
for _ in $(seq 1 300); do
  grep -q '^step ' "$work/lost_node.log" 2>/dev/null && break
  sleep 0.1
done
ip -n "${nodes[1]}" link set eth0 down
ip netns pids "${nodes[1]}" | xargs -r kill -9
cut=$(date +%s)
# The job must end by itself: give it the timeout and 60 s, then end it and fail.
( sleep 65; kill -9 "$job" 2>/dev/null ) > /dev/null 2>&1 &  # no test output held open by it
guard=$!
wait "$job"
status=$?
ended=$(( $(date +%s) - cut ))
pkill -P "$guard" 2>/dev/null
kill "$guard" 2>/dev/null
pkill -9 -f "lost-node-agent-$tag" 2>/dev/null
grep -q "the rank holding the job up is on another node: node2: ranks 2, 3" "$work/lost_node.log" \
  || fail "no rank named the lost node: $(grep -E 'stall|error' "$work/lost_node.log" | head -n 3)"
[ "$status" -eq 4 ] || fail "the job ended with exit status $status after losing a node (expected 4, the stall watchdog's), $ended s after: $(tail -n 5 "$work/lost_node.log")"
[ "$ended" -le 30 ] || fail "the job ended $ended s after losing a node (--collective_timeout 5)"
echo "a lost node (link cut, its processes killed), each node its own --run_dir: node1's ranks named node2's ranks 2, 3 and the job ended, exit status 4, $ended s after the loss (--collective_timeout 5)"
