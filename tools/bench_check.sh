#!/usr/bin/env bash
# A cheap guard against CPU speed regressions (issue 38): chorus's training step against libtorch's,
# in one process, for ResNet-18 batch 8 and BERT-mini batch 8 at 1 thread (train_step_bench
# --check), compared with the ratios docs/benchmarks.md records for this CPU ("bench-check:" lines).
# A ratio that moved by more than 15% prints a WARNING. Informational: always exits 0 (CI runs it
# after the tests; a slow machine next to a quick one must not fail a run).
#
#   bash tools/bench_check.sh            # build (cached after tools/test.sh) and compare
#   BENCH_CHECK_STEPS=20 bash tools/bench_check.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cpu="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
family="$(grep -m1 '^cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
model="$(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
isa=avx2
grep -qw avx512f /proc/cpuinfo && isa=avx512
key="$cpu family $family model $model $isa"

cache="${CHORUS_CACHE_DIR:-$HOME/.cache/chorus}"
if ! bazel build -c opt --disk_cache="$cache/bazel-disk" //tests/bench:train_step_bench >/tmp/bench_check_build.log 2>&1; then
  echo "bench_check: could not build //tests/bench:train_step_bench (see /tmp/bench_check_build.log); nothing compared"
  exit 0
fi
# libtorch's OpenBLAS at its own choice of kernels: OPENBLAS_CORETYPE (Haswell in this project's
# environment) would hold it to AVX2 code beside chorus's AVX-512 (tests/bench/libtorch_peer.h).
out="$(env -u OPENBLAS_CORETYPE bazel-bin/tests/bench/train_step_bench --check --steps "${BENCH_CHECK_STEPS:-10}" --warmup 3)"
echo "$out"
# "| ResNet-18, batch 8 ... | 1 | ms | ms | ratio |" -> resnet18_b8=ratio, bert_mini_b8=ratio
resnet="$(echo "$out" | awk -F'|' '/ResNet-18, batch 8/ { gsub(/ /, "", $6); print $6 }')"
bert="$(echo "$out" | awk -F'|' '/BERT-mini masked LM, batch 8/ { gsub(/ /, "", $6); print $6 }')"
echo "bench_check: this machine ($key): resnet18_b8=$resnet bert_mini_b8=$bert (chorus ms / libtorch ms)"

# The first line for this CPU in docs/benchmarks.md is the one compared (new sections go at the top).
line="$(grep -F -m1 "bench-check: $key:" docs/benchmarks.md)"
if [[ -z "$line" ]]; then
  echo "bench_check: docs/benchmarks.md records no ratios for this CPU; to record them, add the line"
  echo "  bench-check: $key: resnet18_b8=$resnet bert_mini_b8=$bert"
  exit 0
fi
for name in resnet18_b8 bert_mini_b8; do
  recorded="$(echo "$line" | grep -o "$name=[0-9.]*" | cut -d= -f2)"
  measured="$([[ $name == resnet18_b8 ]] && echo "$resnet" || echo "$bert")"
  if [[ -z "$recorded" || -z "$measured" ]]; then
    echo "bench_check: $name: no figure to compare (recorded '$recorded', measured '$measured')"
    continue
  fi
  awk -v n="$name" -v r="$recorded" -v m="$measured" 'BEGIN {
    change = m / r - 1
    if (change > 0.15 || change < -0.15)
      printf "bench_check: WARNING: %s moved by %+.0f%%: %s now, %s recorded for this CPU\n", n, 100 * change, m, r
    else
      printf "bench_check: %s within 15%% (%+.0f%%): %s now, %s recorded\n", n, 100 * change, m, r
  }'
done
exit 0
