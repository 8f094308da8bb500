#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang + ASan + UBSan and runs each for a bounded
# time from its corpus. Any crash, sanitizer finding, uncaught exception other than chorus::Error,
# input slower than 1 s (a hang) or allocation above 1 GiB (unbounded allocation) fails the run;
# the input that found it is copied to tests/fuzz/findings/ (add it to tests/fuzz/corpus/<target>/
# once fixed: the corpus tests replay it from then on).
#
#   bash tools/fuzz.sh [seconds per target, default 20] [target ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds="${1:-20}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(checkpoint idx wordpiece bpe store_frames file_store plan_json launch_env)

# Its own output base: the clang toolchain must not replace the GCC one of the main trees.
output_base="${CHORUS_FUZZ_OUTPUT_BASE:-$HOME/.cache/chorus/bazel-fuzz}"
bazel_fuzz() { bazel --output_base="$output_base" "$@"; }
labels=()
for t in "${targets[@]}"; do labels+=("//tests/fuzz:${t}_fuzz"); done
# --symlink_prefix=/: no bazel-bin/bazel-testlogs links (they would point the main ones at this
# output base).
bazel_fuzz build -c opt --config=fuzz --symlink_prefix=/ "${labels[@]}"
bin="$(bazel_fuzz info -c opt --config=fuzz bazel-bin 2>/dev/null)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
total_runs=0
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"  # new inputs go here, not into the repository's corpus
  log="$work/$t.log"
  echo "fuzz: $t for ${seconds}s"
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin/tests/fuzz/${t}_fuzz" "$work/$t" "tests/fuzz/corpus/$t" -max_total_time="$seconds" -timeout=1 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 -artifact_prefix="$work/$t-" -print_final_stats=1 \
    >"$log" 2>&1; then
    status=1
    echo "fuzz: $t FOUND A DEFECT:"
    grep -E 'ERROR|SUMMARY|fuzz property|unexpected|Test unit written|terminate|==[0-9]+==' "$log" | head -20 | sed 's/^/  /'
    mkdir -p tests/fuzz/findings
    for a in "$work/$t"-*; do
      [[ -f "$a" ]] && cp "$a" "tests/fuzz/findings/$t-$(basename "$a" | sed "s/^$t-//")" && echo "  input: tests/fuzz/findings/$t-$(basename "$a" | sed "s/^$t-//")"
    done
  fi
  runs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)"
  corpus="$(ls "$work/$t" | wc -l)"
  total_runs=$((total_runs + runs))
  # Where coverage stopped growing: the input number at which the edge coverage ("cov:") last rose,
  # against the inputs run in all (a late one says more time would still find more edges).
  read -r cov last_rise < <(awk '/^#[0-9]+/ && / cov: / {
      n = substr($1, 2); for (i = 1; i <= NF; ++i) if ($i == "cov:") c = $(i + 1)
      if (c + 0 > best) { best = c + 0; at = n } }
    END { print best + 0, at + 0 }' "$log")
  echo "fuzz: $t: $runs inputs run, $corpus new corpus entries, $cov edges covered, the last new edge at input $last_rise"
done
echo "fuzz: $total_runs inputs in all over ${#targets[@]} targets"
# The fuzz server holds memory; CI machines have two cores and one main Bazel server besides.
bazel_fuzz shutdown
exit $status
