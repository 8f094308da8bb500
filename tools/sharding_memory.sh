#!/bin/bash
# Per-rank memory of DDP, ZeRO-1 and FSDP (shard_grad_op, full_shard) on sim devices, as in
# docs/sharding.md: GPT-mini at world sizes 1, 2 and 4, and GPT-2 (124M) at world size 4 (DDP and
# full_shard). Writes the JSON lines to docs/data/sharding_memory_<date>.txt (or $1).
#   bash tools/sharding_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/data/sharding_memory_$(date -u +%Y-%m-%d).txt}"
bazel build -c opt //distributed/launcher:chorusrun //tests/bench:sharding_bench >/dev/null 2>&1
run() {  # world model strategy
  echo "\$ chorusrun --nproc-per-node $1 sharding_bench --model $2 --strategy $3 --device sim"
  bazel-bin/distributed/launcher/chorusrun --nproc-per-node "$1" bazel-bin/tests/bench/sharding_bench \
    --model "$2" --strategy "$3" --device sim 2>&1 | grep '"ranks"' | sed 's/^\[0\]: //'
}
{
  echo "# $(date -u) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) ; $(nproc) cores; commit $(git rev-parse --short HEAD)"
  for world in 1 2 4; do
    for strategy in ddp zero1 shard_grad_op full_shard; do run "$world" gpt-mini "$strategy"; done
  done
  for strategy in ddp full_shard; do run 4 gpt2 "$strategy"; done
} | tee "$out"
