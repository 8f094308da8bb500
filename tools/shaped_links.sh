#!/usr/bin/env bash
# Two hosts joined by a rate-limited link (network namespaces + a veth pair shaped with tc tbf on
# both ends), or HOSTS=N hosts on a bridge (each host's egress shaped), one process each: ddp_bench's `link` mode measures a ResNet-18 DDP step across the
# link and predicts it with scaling_projection's model (docs/scaling.md, "Validated on shaped
# links"). Needs root and iproute2. tc netem (added latency) is not used: not every kernel has it.
# NPROC=L runs L processes per host, and ddp_bench measures (and predicts) the hierarchical
# allreduce beside the flat ring (CHORUS_BENCH_LOCAL=L).
#
#   [HOSTS=4] [NPROC=2] bash tools/shaped_links.sh [steps, default 6] [rate ...]     rates as tc writes them; default
#                                                                  "200mbit 1gbit"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps="${1:-6}"
shift || true
rates=("$@")
((${#rates[@]})) || rates=(200mbit 1gbit)
bazel build -c opt //tests/bench:ddp_bench //distributed/launcher:chorusrun >/dev/null 2>&1
bin="$(bazel info -c opt bazel-bin 2>/dev/null)"

hosts="${HOSTS:-2}"
[[ "$hosts" =~ ^[2-9]$ ]] || { echo "shaped_links.sh: HOSTS=$hosts: expected 2 to 9" >&2; exit 2; }
nproc="${NPROC:-1}"
[[ "$nproc" =~ ^[1-8]$ ]] || { echo "shaped_links.sh: NPROC=$nproc: expected 1 to 8" >&2; exit 2; }
# Two hosts: a veth pair. More: each host's veth ends on a bridge in a namespace of its own.
ns=() addr=() dev=()
for ((i = 0; i < hosts; i++)); do
  ns+=("chorus-link-$i")
  addr+=("10.254.7.$((i + 1))")
  dev+=("chorus-lnk-$i")
done
sw=chorus-link-sw
cleanup() {
  for n in "${ns[@]}" "$sw"; do ip netns del "$n" 2>/dev/null || true; done
}
trap cleanup EXIT
cleanup
for n in "${ns[@]}"; do ip netns add "$n"; done
if ((hosts == 2)); then
  ip link add "${dev[0]}" type veth peer name "${dev[1]}"
  ip link set "${dev[0]}" netns "${ns[0]}"
  ip link set "${dev[1]}" netns "${ns[1]}"
else
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < hosts; i++)); do
    ip link add "${dev[$i]}" type veth peer name "chorus-lnk-p$i"
    ip link set "${dev[$i]}" netns "${ns[$i]}"
    ip link set "chorus-lnk-p$i" netns "$sw"
    ip -n "$sw" link set "chorus-lnk-p$i" master br0
    ip -n "$sw" link set "chorus-lnk-p$i" up
  done
fi
for ((i = 0; i < hosts; i++)); do
  ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev "${dev[$i]}"
  ip -n "${ns[$i]}" link set lo up
  ip -n "${ns[$i]}" link set "${dev[$i]}" up
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
  for ((i = 0; i < hosts; i++)); do
    # Egress of each host: the rate, its burst, and a queue of 50 ms.
    ip netns exec "${ns[$i]}" tc qdisc replace dev "${dev[$i]}" root tbf rate "$rate" burst "$burst" latency 50ms
  done
  echo "shaped_links: $hosts hosts x $nproc, $rate ($(ip netns exec "${ns[0]}" tc qdisc show dev "${dev[0]}" | head -n 1))"
  for ((i = hosts - 1; i >= 0; i--)); do
    ip netns exec "${ns[$i]}" env CHORUS_TIMEOUT_S=600 CHORUS_BENCH_LOCAL="$nproc" "$bin/distributed/launcher/chorusrun" --nnodes "$hosts" \
      --node-rank "$i" --nproc-per-node "$nproc" --master-addr "${addr[0]}" --master-port "$port" \
      "$bin/tests/bench/ddp_bench" link "$steps" "$gbps" >"/tmp/shaped_links.$i.log" 2>&1 &
  done
  wait
  grep '^\[0\]' /tmp/shaped_links.0.log | sed 's/^\[0\]: //'
  port=$((port + 1))
done
