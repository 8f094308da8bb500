#!/usr/bin/env bash
# Two hosts joined by a rate-limited link (network namespaces + a veth pair shaped with tc tbf on
# both ends), one process each: ddp_bench's `link` mode measures a ResNet-18 DDP step across the
# link and predicts it with scaling_projection's model (docs/scaling.md, "Validated on shaped
# links"). Needs root and iproute2. tc netem (added latency) is not used: not every kernel has it.
#
#   bash tools/shaped_links.sh [steps, default 6] [rate ...]     rates as tc writes them; default
#                                                                  "200mbit 1gbit"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps="${1:-6}"
shift || true
rates=("$@")
((${#rates[@]})) || rates=(200mbit 1gbit)
bazel build -c opt //tests/bench:ddp_bench //distributed/launcher:chorusrun >/dev/null 2>&1
bin="$(bazel info -c opt bazel-bin 2>/dev/null)"

ns=(chorus-link-a chorus-link-b)
addr=(10.254.7.1 10.254.7.2)
cleanup() { ip netns del "${ns[0]}" 2>/dev/null || true; ip netns del "${ns[1]}" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add "${ns[0]}"
ip netns add "${ns[1]}"
ip link add chorus-lnk-a type veth peer name chorus-lnk-b
ip link set chorus-lnk-a netns "${ns[0]}"
ip link set chorus-lnk-b netns "${ns[1]}"
for i in 0 1; do
  dev=chorus-lnk-$([[ $i == 0 ]] && echo a || echo b)
  ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev "$dev"
  ip -n "${ns[$i]}" link set lo up
  ip -n "${ns[$i]}" link set "$dev" up
done

to_gbps() {  # 200mbit -> 0.2, 1gbit -> 1
  local r="$1"
  case "$r" in
    *gbit) echo "${r%gbit}" ;;
    *mbit) awk -v m="${r%mbit}" 'BEGIN {print m / 1000}' ;;
    *) echo "shaped_links.sh: rate '$r': expected <n>mbit or <n>gbit" >&2; exit 2 ;;
  esac
}

port=29641
for rate in "${rates[@]}"; do
  gbps="$(to_gbps "$rate")"
  # tbf's bucket must hold at least one timer tick of traffic; 10 ms of it (and >= 64 KiB).
  burst="$(awk -v g="$gbps" 'BEGIN {b = g * 1e9 / 8 / 100; if (b < 65536) b = 65536; printf "%d", b}')"
  for i in 0 1; do
    dev=chorus-lnk-$([[ $i == 0 ]] && echo a || echo b)
    # Egress of each end: the rate, its burst, and a queue of 50 ms.
    ip netns exec "${ns[$i]}" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
  done
  echo "shaped_links: $rate ($(ip netns exec "${ns[0]}" tc qdisc show dev chorus-lnk-a | head -n 1))"
  for i in 1 0; do
    ip netns exec "${ns[$i]}" env CHORUS_TIMEOUT_S=600 "$bin/distributed/launcher/chorusrun" --nnodes 2 --node-rank "$i" \
      --nproc-per-node 1 --master-addr "${addr[0]}" --master-port "$port" \
      "$bin/tests/bench/ddp_bench" link "$steps" "$gbps" >"/tmp/shaped_links.$i.log" 2>&1 &
  done
  wait
  grep -v '^\[1\]' /tmp/shaped_links.0.log | sed 's/^\[0\]: //'
  port=$((port + 1))
done
