#!/usr/bin/env bash
# The test entry point (the README's test command; CI runs `tools/test.sh --full` through .ci/run).
#
#   tools/test.sh            set-up, build, and every test case once in -c opt (gpu-tagged ones
#                            too where a GPU is). 20-40 minutes on a fresh 2-core machine
#                            (docs/build.md has the measured times).
#   tools/test.sh --full     What CI runs: every test case once, in the strictest build that can
#                            run it. ASan+UBSan runs every test but the "no_asan" ones (the fuzz
#                            corpora replayed among them); -c opt (with CUDA where a toolkit is)
#                            builds everything but the other tests, and runs those ASan cannot: the
#                            "no_asan" end-to-end runs (and isa_guard_test, which checks the
#                            -c opt build itself), the tests tagged "cuda" (the sanitizer builds
#                            have no CUDA), the benchmarks' tests, and those tagged "also_opt" (what
#                            they check differs in an ASan build); then the kernel tests in -c opt
#                            under each instruction set of this CPU, and ThreadSanitizer on the
#                            concurrent code. The two sanitizer builds compile with clang-14, the
#                            -c opt one with g++ 12 (docs/build.md).
#   tools/test.sh --full --fuzz   that, then each libFuzzer target for CHORUS_FUZZ_SECONDS (20 by
#                            default) in a clang build of its own (docs/build.md says what each adds
#                            and why CI leaves the fuzzing out).
#
# Extra arguments go to the -c opt `bazel test` (e.g. --test_filter=..., --runs_per_test=3).
# Ends with one line "N passed, N failed" that counts each Catch2 test case once, whichever phases
# ran it (failed in any phase: failed); a fuzz target and a non-Catch2 test target are one test
# each. Per-phase lines above it say what each phase ran. Exits non-zero when Bazel failed (a build
# error, a failing test) or any test failed.
#
# Every Bazel invocation here shares one disk cache (CHORUS_CACHE_DIR, default ~/.cache/chorus:
# bazel-disk/), so a second run on the machine, or a fresh clone, rebuilds only what changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=quick
fuzz=0
if [[ "${1:-}" == --full ]]; then
  mode=full
  shift
  if [[ "${1:-}" == --fuzz ]]; then
    fuzz=1
    shift
  fi
fi

bash tools/setup.sh

cache="${CHORUS_CACHE_DIR:-$HOME/.cache/chorus}"
mkdir -p "$cache/bazel-disk"
# Bazel never prunes a disk cache. Past CHORUS_CACHE_MAX_GB (default 30; a cold --full run leaves
# about 9 GB, and a day of rebuilds after header changes about 22), the least recently accessed
# files go until it holds half that, but never a file read or written in the last 26 hours (with
# relatime an access time is at most a day stale): on 2026-11-30 (session 24) a day of --full runs
# had filled it to 34 GB, the prune down to 15 GB reached into blobs the current tree still used,
# and the next --full ran its tests again. Past the limit with nothing that old, the cache stays as
# it is. An action whose entry lost a blob is simply run again (a cache miss).
max_kb=$(( ${CHORUS_CACHE_MAX_GB:-30} * 1024 * 1024 ))
used_kb=$(du -sk "$cache/bazel-disk" | cut -f1)
if (( used_kb > max_kb )); then
  echo "tools/test.sh: the disk cache holds $((used_kb / 1024)) MiB (over CHORUS_CACHE_MAX_GB); removing the least recently used files"
  # (awk reads everything, so that sort never writes into a closed pipe: SIGPIPE under pipefail)
  find "$cache/bazel-disk" -type f -amin +1560 -printf '%A@ %k %p\n' | sort -n |
    awk -v over=$((used_kb - max_kb / 2)) '{ if (freed < over) { freed += $2; sub(/^[^ ]+ [^ ]+ /, ""); print } }' |
    xargs -r -d '\n' rm -f
fi
common=(--disk_cache="$cache/bazel-disk" --keep_going
  --test_env=CHORUS_DATA_DIR="${CHORUS_DATA_DIR:-$HOME/.cache/chorus/data}")
# CHORUS_CUDA_ARCHS (e.g. 90), read by @local_cuda's rule (third_party/cuda/cuda_configure.bzl):
# the GPUs nvcc compiles for, default sm_80 and sm_90. .ci/run sets 90 on a machine without a GPU, and
# CHORUS_CUDA_HOST_OPT=0 (the .cu files' host code at -O0: none of it can run there).

# Tests tagged "gpu" need a device; without one they are still built (linking included), not run.
# Each phase runs the tests whose tags it does not skip: "asan_only" ones (a subset of another
# test's cases) only in the ASan phase, "no_asan" ones (long end-to-end runs of code whose units
# run under ASan in their own tests) in every phase but that one.
no_gpu=0
nvidia-smi -L >/dev/null 2>&1 || no_gpu=1
skip_tags() {  # skip_tags TAG...: the --test_tag_filters flag that leaves out these tags (and gpu)
  local tags=("$@")
  ((no_gpu)) && tags=(gpu "${tags[@]}")
  local IFS=,
  echo "--test_tag_filters=${tags[*]/#/-}"
}

results="$(mktemp)"  # one line per test per phase: phase <TAB> test <TAB> passed|failed|skipped
output="$(mktemp)"
opt_patterns="$(mktemp)"
trap 'rm -f "$results" "$output" "$opt_patterns"' EXIT
phase_lines=()
rc=0

# --- Counting: read_log, read_run, count_failed, summarize_phase (tools/test_count.sh, which
# tests/tools:test_count_test checks on Bazel outputs made up for it) ------------------------------
# shellcheck source=tools/test_count.sh
source tools/test_count.sh


# Runs one phase: `bazel [--output_base=BASE] test CONFIG... ARGS...`, its output to the console
# and $output, then counts. BASE "" is the workspace's own output base; CONFIG (the global array
# $config) are the flags that pick the output tree, which `bazel info` needs too.
# [Stale libomp registrations] clang's OpenMP runtime (libomp, in the sanitizer builds) registers
# each process in /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid> and removes the file at exit; a process
# killed by a signal (the tests' stopped ranks and launchers) leaves it, and one killed between
# creating the file and writing it leaves it empty, which makes every later process of that pid
# abort with "OMP: Error #15: ... found unknown library already initialized". Sandboxed tests have a
# /dev/shm of their own ([A /dev/shm per test], .bazelrc); the tests that run outside the sandbox
# ("no-sandbox") and programs run by hand still write here, so every phase starts by removing the
# files of pids that are not running and the empty ones (nothing else runs at that moment).
clear_stale_omp_registrations() {
  local f pid
  for f in /dev/shm/__KMP_REGISTERED_LIB_*; do
    [[ -e "$f" ]] || continue
    pid="${f#/dev/shm/__KMP_REGISTERED_LIB_}"
    pid="${pid%%_*}"
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    if ! kill -0 "$pid" 2>/dev/null || [[ -z "$(tr -d '\0' <"$f" 2>/dev/null)" ]]; then
      rm -f "$f"
    fi
  done
  return 0
}

phase() {
  local name="$1" base="$2" start testlogs code
  shift 2
  clear_stale_omp_registrations
  local startup=()
  [[ -n "$base" ]] && startup=(--output_base="$base")
  start=$SECONDS
  echo "=== tools/test.sh: phase $name: bazel ${startup[*]} test ${config[*]} $*"
  set +e
  # Each phase keeps its profile (the output base's own is overwritten by the next command):
  # `python3 tools/build_profile.py ~/.cache/chorus/profiles/<phase>.profile.gz` lists its slowest
  # actions.
  mkdir -p "$cache/profiles"
  bazel "${startup[@]}" test "${config[@]}" --profile="$cache/profiles/$name.profile.gz" "$@" 2>&1 | tee "$output"
  code=${PIPESTATUS[0]}
  set -e
  ((code == 0)) || rc=1
  testlogs="$(bazel "${startup[@]}" info "${config[@]}" bazel-testlogs 2>/dev/null | tail -n 1)" || true
  read_run "$name" "$testlogs"
  if ((code != 0)) && ! grep -q "^$name	.*	failed\$" "$results"; then
    # Bazel failed without a failed test (a BUILD error, a failed build of a non-test target).
    printf '%s\tbazel in phase %s (exit %d: see its output above)\tfailed\n' "$name" "$name" "$code" >>"$results"
  fi
  phase_lines+=("$(summarize_phase "$name") in $((SECONDS - start)) s")
}


# --- 1. -c opt (the build with CUDA where a toolkit is) -------------------------------------------
# Quick: everything built, every test run. --full: everything built but the tests (and their
# test-only helpers) that the ASan phase runs, for cases that run under ASan+UBSan anyway: a cold
# --full on 2 cores went from 90 min 22 s to 73 min 31 s, its opt phase from 2,092 s to 1,263 s
# (2026-11-30, docs/build.md).
# The optimized build's own code still runs in the tests kept here, the examples_test end-to-end
# runs among them, and the kernel tests' -c opt reruns at each instruction set (phase 2).
config=(-c opt)
opt_targets=(//...)
if [[ "$mode" == full ]]; then
  opt_only='attr(tags, "\b(no_asan|cuda|also_opt)\b", tests(//...)) + tests(//tests/bench/...)'
  left_out="$(bazel query "attr(testonly, 1, //...) except ($opt_only)" 2>/dev/null)" || {
    echo "tools/test.sh: bazel query failed; the -c opt phase builds and runs everything"
    left_out=""
  }
  # One pattern a line: //... less each left-out label (a left-out helper that a kept test needs is
  # still built as its dependency).
  { echo //...; grep -v '^$' <<<"$left_out" | sed 's/^/-/' || true; } >"$opt_patterns"
  opt_targets=(--target_pattern_file="$opt_patterns")
  echo "tools/test.sh: the -c opt phase leaves out $(grep -c '^-' "$opt_patterns" || true) test-only targets (listed in $opt_patterns while it runs)"
fi
phase opt "" "${common[@]}" "$(skip_tags asan_only)" "$@" "${opt_targets[@]}"

if [[ "$mode" == full ]]; then
  # --- 2. The kernel tests under each instruction set this CPU has ------------------------------
  # (CHORUS_CPU_CAPABILITY: oneDNN's cap, and the variant of chorus's own vector loops,
  # kernels/cpu/capability.h), so the kernels run-time dispatch would pick on other machines run
  # here too. The default capability of this machine ran in phase 1.
  caps=(avx2 default)
  grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo &&
    grep -qw avx512dq /proc/cpuinfo && caps=(avx512 "${caps[@]}")
  for cap in "${caps[@]}"; do
    phase "isa-$cap" "" "${common[@]}" --test_env=CHORUS_CPU_CAPABILITY="$cap" \
      //tests/nn:conv_test //tests/nn:loss_test //tests/tensor:reduce_linalg_index_test \
      //tests/tensor:elementwise_test //tests/tensor:unary_test //tests/optim:optim_test \
      //tests/kernels/cpu:capability_test //tests/kernels/cpu:gemm_test //tests/kernels/cpu:conv_weight_grad_test \
      //tests/kernels/cpu:conv_scratch_test \
      //tests/kernels/shared:pointwise_math_test //tests/kernels/shared:optim_math_test //tests/kernels/shared:philox_test
  done
  # The main server is not needed again; its memory is better left to the sanitizer builds.
  bazel shutdown >/dev/null 2>&1 || true

  # --- 3 and 4. The sanitizer builds, both without CUDA, in one output base of their own --------
  # CUDA_HOME=/nonexistent (--config=tsan / --config=asan): nvcc's host objects are not
  # instrumented, and for TSan their copies of inline code hide synchronization from it
  # (docs/reliability.md); no CUDA code can run on a machine without a GPU anyway, and compiling
  # every kernel with nvcc again would cost minutes. Changing CUDA_HOME reconfigures @local_cuda,
  # hence the output base of its own (no convenience symlinks from it: --symlink_prefix=/).
  nocuda_base="${CHORUS_NOCUDA_OUTPUT_BASE:-$cache/bazel-nocuda}"
  # 3. ThreadSanitizer on the concurrent code: the device runtime, the sim device, the caching
  #    allocator, the stream-ordered process group and DDP's reducer on a device, the store (server
  #    and client threads), the data loader's workers, the autograd engine and hooks
  #    (OMP_NUM_THREADS=1: libomp, clang's OpenMP runtime, is not instrumented, so its thread pool would report false races),
  #    and the multi-process tests (every worker a TSan build: collectives, DDP and pipelines on sim
  #    devices over real sockets).
  config=(-c opt --config=tsan)
  phase tsan "$nocuda_base" --symlink_prefix=/ "${common[@]}" --test_env=OMP_NUM_THREADS=1 \
    //tests/tensor:device_runtime_tsan_test //tests/distributed:stream_group_tsan_test \
    //tests/distributed:store_test //tests/data:data_test //tests/autograd:engine_test \
    //tests/autograd:hooks_test //tests/distributed:multiprocess_test //tests/utils:summary_writer_test \
    //tests/distributed:heartbeat_test //tests/distributed:flight_recorder_test
  # 4. Every test under AddressSanitizer + UndefinedBehaviorSanitizer (no recovery, leaks
  #    reported) but the "no_asan" ones (examples_asan_test runs a subset of examples_test's cases
  #    instead); the benchmarks are left out, and so are the few tests that exist only in a CUDA
  #    build (they ran in phase 1). --build_tests_only: what it does not run (the "no_asan" and
  #    "gpu" tests, tests/'s stand-alone programs) is not built here either; phase 1 built it.
  config=(-c opt --config=asan)
  phase asan "$nocuda_base" --symlink_prefix=/ "${common[@]}" "$(skip_tags no_asan)" --build_tests_only \
    -- //tests/... -//tests/bench/...
  bazel --output_base="$nocuda_base" shutdown >/dev/null 2>&1 || true

  # --- 5. chorus used from outside the repository (tools/outside_test.sh): a Bazel workspace that
  # declares @chorus, and a CMake project against tools/install.sh's tree. Its own output base
  # (under $cache/outside), so a rerun is incremental; the disk cache is shared.
  start=$SECONDS
  echo "=== tools/test.sh: phase outside: tools/outside_test.sh"
  set +e
  bash tools/outside_test.sh "$cache/outside" 2>&1 | tee "$output"
  code=${PIPESTATUS[0]}
  set -e
  ((code == 0)) || rc=1
  for way in bazel cmake; do
    if grep -q "^outside_test: PASSED $way\$" "$output"; then
      printf 'outside\toutside: %s\tpassed\n' "$way" >>"$results"
    else
      printf 'outside\toutside: %s\tfailed\n' "$way" >>"$results"
    fi
  done
  phase_lines+=("$(summarize_phase outside) in $((SECONDS - start)) s")

  # --- 6. With --fuzz: the libFuzzer targets (tests/fuzz/), clang + ASan + UBSan -----------------
  # Each for CHORUS_FUZZ_SECONDS (20 by default) from its corpus; a finding fails the run
  # (tools/fuzz.sh). Each target counts as one test. Not in CI: the clang build of everything the
  # parsers link is a third toolchain's build of the library (12 minutes cold on a 2-core Zen 3),
  # for 20 s of fuzzing a target; the corpora (seeds and every past finding) are replayed in the
  # asan phase above by //tests/fuzz:*_corpus_test.
  if ((fuzz)) && [[ "${CHORUS_FUZZ_SECONDS:-20}" != 0 ]]; then
    start=$SECONDS
    echo "=== tools/test.sh: phase fuzz: tools/fuzz.sh ${CHORUS_FUZZ_SECONDS:-20}"
    set +e
    CHORUS_FUZZ_OUTPUT_BASE="${CHORUS_FUZZ_OUTPUT_BASE:-$cache/bazel-fuzz}" \
      bash tools/fuzz.sh "${CHORUS_FUZZ_SECONDS:-20}" 2>&1 | tee "$output"
    code=${PIPESTATUS[0]}
    set -e
    ((code == 0)) || rc=1
    sed -nE 's/^fuzz: ([a-z_]+): [0-9]+ inputs run.*/fuzz\tfuzz:\1\tpassed/p' "$output" >>"$results"
    sed -nE 's/^fuzz: ([a-z_]+) FOUND A DEFECT.*/fuzz\tfuzz:\1\tfailed/p' "$output" >>"$results"
    # The build itself failed: no target ran.
    grep -q '^fuzz	' "$results" || printf 'fuzz\tfuzz: the build (tools/fuzz.sh)\tfailed\n' >>"$results"
    phase_lines+=("$(summarize_phase fuzz) in $((SECONDS - start)) s")
  fi
fi

# --- The count --------------------------------------------------------------------------------
if ((no_gpu)); then
  gpu_skipped="$(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null | wc -l || true)"
  echo "(no GPU here: $gpu_skipped gpu-tagged test target(s) built but not run)"
fi
skipped_names="$(awk -F'\t' '$3 == "skipped" { print $2 }' "$results" | sort -u)"
failed_names="$(awk -F'\t' '$3 == "failed" { print $2 }' "$results" | sort -u)"
if [[ -n "$skipped_names" ]]; then
  echo "Skipped (could not run on this machine; the CHORUS-SKIP lines above say why):"
  sed 's/^/  /' <<<"$skipped_names"
fi
if [[ -n "$failed_names" ]]; then
  echo "Failed:"
  awk -F'\t' '$3 == "failed" { print "  " $1 ": " $2 }' "$results" | sort -u
fi
for line in "${phase_lines[@]}"; do echo "$line"; done
# Each test once: failed if it failed in any phase, else passed if it passed in any, else skipped.
read -r passed failed skipped < <(awk -F'\t' '
  { if ($3 == "failed") s[$2] = "failed"
    else if ($3 == "passed" && s[$2] != "failed") s[$2] = "passed"
    else if (!($2 in s)) s[$2] = "skipped" }
  END { for (k in s) n[s[k]]++; printf "%d %d %d\n", n["passed"], n["failed"], n["skipped"] }' "$results")
if ((skipped > 0)); then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
if ((rc != 0 || failed > 0)); then
  exit 1
fi
