# The namespace cluster the multi-node scripts share (tests/multinode/*.sh): each "node" a Linux
# network namespace joined to the others by a bridge and veth links (NET.K/24), with a host name of its
# own (a UTS namespace), and a launch agent that enters the namespace in place of ssh, so `mpirun
# --hostfile` runs ranks on different nodes that talk over TCP. Sourced after cluster_test_lib.sh:
#   cluster_start NET COUNT    bridge and nodes 1..COUNT at NET.1 ..., NET.254 on the bridge; sets
#                              tag, bridge, work, nodes[] (namespace names) and across[] (mpirun's flags)
#   cluster_node K ADDRESS     one more namespace trn<tag>_K at ADDRESS (a launch node)
#   hostfile NODES RANKS       a hostfile of NODES nodes with RANKS slots each; prints its path
#   cluster_shape RATE         every node's eth0 sends at RATE (tc's form: 1gbit, 200mbit; a token
#                              bucket on its egress, so each direction between two nodes runs at RATE)
#   rate_gbs RATE              RATE in GB/s, as `trainer estimate --inter_node_gbs` takes it
#   node_cores                 this machine's cores over the nodes: one node's share (at least 1)
# Needs root (ip netns, unshare): skip (exit 77) naming what is missing otherwise. Scripts that run
# side by side pass different NETs (each bridge routes its /24 on the host).
command -v ip >/dev/null && command -v unshare >/dev/null || skip "no ip or unshare here (iproute2, util-linux)"

tag=$(( $$ % 1000 ))
bridge=trbr$tag
work=$(mktemp -d /tmp/multinode_test.XXXXXX)
nodes=()
cluster_cleanup() {
  pkill -9 -f "lost-node-agent-$tag" 2>/dev/null
  for ns in "${nodes[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  ip link del "$bridge" 2>/dev/null
  [ -n "${KEEP_MULTINODE_TEST:-}" ] || rm -rf "$work"
}
trap cluster_cleanup EXIT

cluster_node() {  # K ADDRESS
  local ns=trn${tag}_$1
  ip netns add "$ns" || skip "cannot make a network namespace here (ip netns add)"
  nodes+=("$ns")
  ip link add "trv${tag}_$1" type veth peer name eth0 netns "$ns" || skip "cannot make veth links here"
  ip link set "trv${tag}_$1" master "$bridge"
  ip link set "trv${tag}_$1" up
  ip -n "$ns" addr add "$2/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
}

cluster_start() {  # NET COUNT
  net=$1
  ip link add "$bridge" type bridge 2>/dev/null || skip "cannot make a bridge here (ip link add type bridge: needs root or CAP_NET_ADMIN)"
  ip link set "$bridge" up
  ip addr add "$net.254/24" dev "$bridge"
  for k in $(seq 1 "$2"); do cluster_node "$k" "$net.$k"; done
  ip netns exec "${nodes[0]}" unshare --uts true 2>/dev/null || skip "cannot make a UTS namespace here (unshare --uts)"
  # The launch agent: Open MPI runs "AGENT HOST COMMAND..." where ssh would go; COMMAND is a line for
  # the remote shell (with mpirun given by its absolute path it begins "PATH=...; export PATH; ..."), so
  # it runs under sh -c as it is, not exec'd.
  cat > "$work/agent.sh" <<AGENT
#!/usr/bin/env bash
host=\$1; shift
k=\${host##*.}
exec ip netns exec trn${tag}_\$k unshare --uts sh -c "hostname node\$k; \$*"
AGENT
  chmod +x "$work/agent.sh"
  across=(--mca plm_rsh_agent "$work/agent.sh" --mca oob_tcp_if_include "$net.0/24"
          --mca btl_tcp_if_include "$net.0/24" --mca btl self,tcp,vader -x OMP_NUM_THREADS)
}

hostfile() {  # nodes ranks_per_node
  for k in $(seq 1 "$1"); do echo "$net.$k slots=$2"; done > "$work/hosts_$1"
  echo "$work/hosts_$1"
}
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

cluster_shape() {  # RATE
  command -v tc >/dev/null || skip "no tc here (iproute2)"
  local ns
  for ns in "${nodes[@]}"; do
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$1" burst 256kb latency 400ms \
      || skip "cannot shape a link here (tc qdisc tbf)"
  done
}

rate_gbs() {  # RATE
  "$PY" -c "import re, sys; n, u = re.fullmatch(r'(\d+)(gbit|mbit)', sys.argv[1]).groups(); print(int(n) * (1e9 if u == 'gbit' else 1e6) / 8e9)" "$1"
}

node_cores() {
  local cores=$(( $(nproc --all) / ${#nodes[@]} ))
  echo $(( cores > 0 ? cores : 1 ))
}
