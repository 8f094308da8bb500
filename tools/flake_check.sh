#!/usr/bin/env bash
# Runs the tests most exposed to timing (multi-process, streams, the launcher, pipelines, the
# examples) several times each with a busy loop beside them on the machine's cores, in each
# configuration tools/test.sh --full runs them in, and prints per target how many runs failed or
# timed out. A flaky test shows here before it shows in CI (docs/build.md, "Flakes").
#
#   bash tools/flake_check.sh [runs, default 5] [opt|tsan|asan ...]   (default: all three)
# Uses the output bases and disk cache of tools/test.sh (CHORUS_CACHE_DIR).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs="${1:-5}"
shift || true
modes=("$@")
((${#modes[@]})) || modes=(opt tsan asan)

cache="${CHORUS_CACHE_DIR:-$HOME/.cache/chorus}"
common=(--disk_cache="$cache/bazel-disk" --keep_going --runs_per_test="$runs"
  --test_env=CHORUS_DATA_DIR="${CHORUS_DATA_DIR:-$HOME/.cache/chorus/data}")
exposed=(//tests/distributed:multiprocess_test //tests/distributed:stream_group_test
  //tests/distributed:chorusrun_test //tests/distributed:hosts_test //tests/pipeline:pipeline_test
  //tests/pipeline:pipeline_example_test //tests/examples:examples_test //tests/tensor:sim_runtime_test
  //tests/tensor:caching_allocator_test)
tsan_exposed=(//tests/distributed:multiprocess_test //tests/distributed:stream_group_tsan_test
  //tests/tensor:device_runtime_tsan_test)

# One busy loop per core, for the whole check.
busy=()
for _ in $(seq "$(nproc)"); do
  bash -c 'while :; do :; done' &
  busy+=($!)
done
trap 'kill "${busy[@]}" 2>/dev/null || true' EXIT

status=0
for mode in "${modes[@]}"; do
  start=$SECONDS
  out="$(mktemp)"
  case "$mode" in
    opt) cmd=(bazel test -c opt "${common[@]}" "${exposed[@]}") ;;
    tsan) cmd=(bazel --output_base="$cache/bazel-nocuda" test -c opt --config=tsan --symlink_prefix=/ "${common[@]}"
               --test_env=OMP_NUM_THREADS=1 "${tsan_exposed[@]}") ;;
    asan) cmd=(bazel --output_base="$cache/bazel-nocuda" test -c opt --config=asan --symlink_prefix=/ "${common[@]}"
               "${exposed[@]}") ;;
    *) echo "flake_check: unknown mode '$mode' (expected opt, tsan or asan)" >&2; exit 2 ;;
  esac
  echo "=== flake_check: $mode, $runs runs each, $(nproc) busy loops beside: ${cmd[*]}"
  set +e
  "${cmd[@]}" 2>&1 | tee "$out" | grep -E '^//|Stats over|FLAKY|TIMEOUT|FAILED'
  code=${PIPESTATUS[0]}
  set -e
  ((code == 0)) || status=1
  # Bazel's summary: a target that failed some runs is FLAKY (passed others) or FAILED.
  echo "flake_check: $mode: $(grep -cE '^//.* PASSED' "$out") target(s) passed all $runs runs," \
    "$(grep -cE '^//.* (FLAKY|FAILED|TIMEOUT)' "$out") did not, in $((SECONDS - start)) s"
  rm -f "$out"
done
exit $status
