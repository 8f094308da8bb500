#!/usr/bin/env bash
# The one test entry point (CI runs it through .ci/run): setup, build everything, run every test
# this machine can run, and end with one line "N passed, N failed" counting Catch2 test cases.
# Extra arguments go to `bazel test` (e.g. --test_filter=..., --runs_per_test=3).
# Exits non-zero when bazel fails (build error, failing test) or any test case failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tools/setup.sh

# Tests tagged "gpu" need a device; without one they are still built (linking included) by
# `bazel test //...`, just not run.
filters=()
if ! nvidia-smi -L >/dev/null 2>&1; then
  filters=(--test_tag_filters=-gpu)
fi

# --- Count Catch2 test cases ----------------------------------------------------------------
# Bazel's summary names every test target of this invocation with its status; reading only those
# targets' logs keeps stale logs (deleted targets, earlier runs) out of the count. A cached PASSED
# target still has its log from the run that produced the cached result.
passed=0
failed=0
skipped=0
testlogs=bazel-testlogs  # the convenience symlink: the latest invocation's test logs

# Adds one test log's Catch2 summary to passed/failed; returns 1 when the log has no summary. A test
# case that could not run here prints a line "CHORUS-SKIP: why" and returns: counted as skipped.
count_log() {
  local log="$1" line n word rest part parts skips
  line="$(grep -E '^All tests passed \(|^test cases: ' "$log" | tail -n 1)" || return 1
  skips="$(grep -c '^CHORUS-SKIP' "$log" || true)"
  if ((skips > 0)); then
    skipped=$((skipped + skips))
    passed=$((passed - skips))
    grep '^CHORUS-SKIP' "$log" | sed 's/^/  /'
  fi
  if [[ "$line" =~ ^All\ tests\ passed\ \([0-9]+\ assertions?\ in\ ([0-9]+)\ test\ cases?\) ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    return 0
  fi
  # "test cases: 5 | 3 passed | 1 failed | 1 failed as expected" (parts absent when zero).
  IFS='|' read -ra parts <<<"${line#test cases:}"
  for part in "${parts[@]:1}"; do
    read -r n word rest <<<"$part"
    if [[ "$word" == passed || ( "$word" == failed && "$rest" == "as expected" ) ]]; then
      passed=$((passed + n))
    elif [[ "$word" == failed ]]; then
      failed=$((failed + n))
    fi
  done
}

# Adds the test targets of one bazel invocation (its output in $1) to passed/failed.
count_run() {
  local output="$1" line label status dir failed_before have_summary log logs
  status_re='^(//[^ ]+:[^ ]+) +(\(cached\) )?(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|INCOMPLETE|REMOTE FAILURE)'
  while IFS= read -r line; do
    [[ "$line" =~ $status_re ]] || continue
    label="${BASH_REMATCH[1]}"
    status="${BASH_REMATCH[3]}"
    dir="$testlogs/${label#//}"
    dir="${dir/://}"
    failed_before=$failed
    have_summary=0
    # Not built or not run: a log there (if any) is from an earlier build; do not read it.
    if [[ "$status" != "NO STATUS" && "$status" != "FAILED TO BUILD" ]]; then
      # One log per target, or one per shard / run. Shard and run folders stay behind after a
      # later plain run, so they count only when not older than the target's own test.log.
      logs=()
      for log in "$dir"/shard_*_of_*/test.log "$dir"/run_*_of_*/test.log "$dir"/shard_*_of_*/run_*_of_*/test.log; do
        [[ -f "$log" ]] || continue
        [[ -f "$dir/test.log" && "$log" -ot "$dir/test.log" ]] && continue
        logs+=("$log")
      done
      ((${#logs[@]})) || logs=("$dir/test.log")
      for log in "${logs[@]}"; do
        [[ -f "$log" ]] && count_log "$log" && have_summary=1
      done
    fi
    if [[ "$status" == PASSED || "$status" == FLAKY ]]; then
      # A passing test that is not a Catch2 binary counts as one passed test.
      ((have_summary)) || passed=$((passed + 1))
    elif ((failed == failed_before)); then
      # Failed without any failed test case in its summary: crash, timeout, not built, sanitizer.
      failed=$((failed + 1))
    fi
  done <"$output"
}


output="$(mktemp)"
trap 'rm -f "$output"' EXIT
data_env=--test_env=CHORUS_DATA_DIR="${CHORUS_DATA_DIR:-$HOME/.cache/chorus/data}"
set +e
# 1. The device runtime, the sim device, the caching allocator, the stream-ordered process group and
#    DDP's reducer on a device are concurrent code: their tests
#    also run under ThreadSanitizer, and so do the multi-process tests (every worker a TSan build:
#    collectives, DDP and pipelines on sim devices over real sockets). Counted before the main run,
#    because bazel-testlogs follows the latest invocation.
#    Also the store (server and client threads), the data loader's worker threads and the autograd
#    engine and hooks (OMP_NUM_THREADS=1: libgomp is not instrumented, so its thread pool would
#    report false races; the engine's and loader's own threads are what is checked here).
#    Its own output base, built without CUDA (--config=tsan sets CUDA_HOME=/nonexistent): nvcc's
#    objects are not instrumented, and the linker may keep their copy of an inline function
#    (shared_ptr's release, say), hiding the synchronization TSan must see (docs/reliability.md).
#    No convenience symlinks from it (--symlink_prefix=/): bazel-<workspace> would point into the
#    other output base, and the main run's //... would then walk it as a package.
tsan_base="${CHORUS_TSAN_OUTPUT_BASE:-$HOME/.cache/chorus/bazel-tsan}"
testlogs="$(bazel --output_base="$tsan_base" info -c opt --config=tsan bazel-testlogs 2>/dev/null)"
bazel --output_base="$tsan_base" test -c opt --config=tsan --symlink_prefix=/ --keep_going "$data_env" --test_env=OMP_NUM_THREADS=1 \
  //tests/tensor:device_runtime_tsan_test //tests/distributed:stream_group_tsan_test \
  //tests/distributed:store_test //tests/data:data_test //tests/autograd:engine_test \
  //tests/autograd:hooks_test //tests/distributed:multiprocess_test 2>&1 | tee "$output"
tsan_rc=${PIPESTATUS[0]}
count_run "$output"
bazel --output_base="$tsan_base" shutdown >/dev/null 2>&1 || true
testlogs=bazel-testlogs
# 2. Everything else. --keep_going: a target that fails to build must not stop every other test.
bazel test //... -c opt --keep_going "$data_env" "${filters[@]}" "$@" 2>&1 | tee "$output"
bazel_rc=${PIPESTATUS[0]}
count_run "$output"
# 3. The kernel tests again under each instruction set this CPU has (CHORUS_CPU_CAPABILITY: oneDNN's
#    cap, and the variant of chorus's own vector loops, kernels/cpu/capability.h), so the kernels the
#    run-time dispatch would pick on other machines run here too.
caps=(avx2 default)
grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo &&
  grep -qw avx512dq /proc/cpuinfo && caps=(avx512 "${caps[@]}")
cap_rc=0
for cap in "${caps[@]}"; do
  bazel test -c opt --keep_going "$data_env" --test_env=CHORUS_CPU_CAPABILITY="$cap" //tests/nn:conv_test \
    //tests/nn:loss_test //tests/tensor:reduce_linalg_index_test //tests/tensor:elementwise_test \
    //tests/tensor:unary_test //tests/optim:optim_test //tests/kernels/cpu:capability_test \
    //tests/kernels/shared:pointwise_math_test //tests/kernels/shared:optim_math_test \
    //tests/kernels/shared:philox_test 2>&1 | tee "$output"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) || cap_rc=$rc
  count_run "$output"
done
# 4. The whole CPU suite again under AddressSanitizer + UndefinedBehaviorSanitizer (--config=asan,
#    .bazelrc: no recovery, leaks reported), in its own output tree; the benchmarks are left out.
bazel test -c opt --config=asan --keep_going "$data_env" "${filters[@]}" -- //tests/... -//tests/bench/... 2>&1 |
  tee "$output"
asan_rc=${PIPESTATUS[0]}
count_run "$output"
# 5. The libFuzzer targets (tests/fuzz/), clang + ASan + UBSan in their own output base, each for
#    CHORUS_FUZZ_SECONDS (30 by default) from its corpus; a finding fails the run (tools/fuzz.sh).
#    Each target counts as one test.
fuzz_rc=0
if [[ "${CHORUS_FUZZ_SECONDS:-30}" != 0 ]]; then
  bash tools/fuzz.sh "${CHORUS_FUZZ_SECONDS:-30}" 2>&1 | tee "$output"
  fuzz_rc=${PIPESTATUS[0]}
  fuzz_found="$(grep -c 'FOUND A DEFECT' "$output" || true)"
  fuzz_targets="$(grep -cE '^fuzz: [a-z_]+: [0-9]+ inputs run' "$output" || true)"
  passed=$((passed + fuzz_targets - fuzz_found))
  failed=$((failed + fuzz_found))
  ((fuzz_rc == 0 || fuzz_found > 0)) || failed=$((failed + 1))  # the build itself failed
fi
set -e

if ((${#filters[@]})); then
  # (|| true: a failing query must not end the script before its count line.)
  gpu_skipped="$(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null | wc -l || true)"
  echo "(no GPU here: $gpu_skipped gpu-tagged test target(s) built but not run)"
fi
((skipped == 0)) || echo "($skipped test case(s) skipped: they could not run on this machine, see CHORUS-SKIP above)"
echo "$passed passed, $failed failed"
if ((bazel_rc != 0 || tsan_rc != 0 || cap_rc != 0 || asan_rc != 0 || fuzz_rc != 0 || failed > 0)); then
  exit 1
fi
