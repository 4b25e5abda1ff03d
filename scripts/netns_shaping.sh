#!/usr/bin/env bash
# Kernel link shaping for runs as root: two network namespaces joined by a veth pair, the edge's
# side rate-limited with tc tbf, the rate changeable live. More faithful than the userspace relay
# (splitinfer netem) for rate: the kernel's TCP sees a real bottleneck queue. This kernel has no
# netem qdisc, so one-way delay and loss stay in the relay (chain the two if you need both).
#
#   sudo scripts/netns_shaping.sh up 20mbit      # si-edge (10.77.0.1) <-> si-cloud (10.77.0.2)
#   sudo scripts/netns_shaping.sh rate 5mbit     # change the rate live
#   sudo scripts/netns_shaping.sh replay TRACE.csv [SPEEDUP]   # follow a time_s,mbps trace
#   sudo scripts/netns_shaping.sh down
#
# Then: ip netns exec si-cloud splitinfer cloud serve ... --listen 10.77.0.2:7000
#       ip netns exec si-edge   splitinfer edge run ... --cloud tcp://10.77.0.2:7000
set -euo pipefail
EDGE=si-edge CLOUD=si-cloud
BURST=${BURST:-32kb} LATENCY=${LATENCY:-50ms}

shape() {  # rate for both directions (each namespace shapes its egress)
  local rate=$1
  ip netns exec "$EDGE" tc qdisc replace dev veth-edge root tbf rate "$rate" burst "$BURST" latency "$LATENCY"
  ip netns exec "$CLOUD" tc qdisc replace dev veth-cloud root tbf rate "$rate" burst "$BURST" latency "$LATENCY"
}

case "${1:-}" in
  up)
    ip netns add "$EDGE"; ip netns add "$CLOUD"
    ip link add veth-edge type veth peer name veth-cloud
    ip link set veth-edge netns "$EDGE"; ip link set veth-cloud netns "$CLOUD"
    ip netns exec "$EDGE" ip addr add 10.77.0.1/30 dev veth-edge
    ip netns exec "$CLOUD" ip addr add 10.77.0.2/30 dev veth-cloud
    for ns in "$EDGE" "$CLOUD"; do ip netns exec "$ns" ip link set lo up; done
    ip netns exec "$EDGE" ip link set veth-edge up; ip netns exec "$CLOUD" ip link set veth-cloud up
    shape "${2:-20mbit}"
    echo "si-edge 10.77.0.1 <-> si-cloud 10.77.0.2 at ${2:-20mbit}" ;;
  rate) shape "$2" ;;
  replay)
    speed=${3:-1}; prev=0
    tail -n +2 "$2" | while IFS=, read -r t mbps; do
      sleep "$(awk -v a="$t" -v b="$prev" -v s="$speed" 'BEGIN{d=(a-b)/s; print (d>0?d:0)}')"
      # tbf cannot do 0: an outage is a very low rate
      shape "$(awk -v r="$mbps" 'BEGIN{printf "%dkbit", (r*1000<8?8:r*1000)}')"; prev=$t
    done ;;
  down) ip netns del "$EDGE" 2>/dev/null || true; ip netns del "$CLOUD" 2>/dev/null || true ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
