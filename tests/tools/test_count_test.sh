#!/usr/bin/env bash
# tools/test.sh's count (tools/test_count.sh) on a Bazel output and test logs made up here: every
# status-line form Bazel prints (plain, "(cached)", "(2/3 cached)" for a sharded target whose
# shards were partly reused, FAILED, FAILED TO BUILD), shard logs, shard-and-run logs
# (shard_i_of_S_run_j_of_R), logs left by an earlier --runs_per_test beside a cached result (not
# read, sharded or not), a case that never ended, a CHORUS-SKIP, and a
# passing test that is not a Catch2 binary. Each made-up case is counted once, as what it is. (A
# FLAKY target, which only a --flaky_test_attempts run can give, counts its failed attempt as a
# failure: tools/test.sh treats a flake as a defect.)
set -euo pipefail
count_sh="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-chorus}/tools/test_count.sh"
[[ -f "$count_sh" ]] || count_sh="$(dirname "${BASH_SOURCE[0]}")/../../tools/test_count.sh"
# shellcheck source=tools/test_count.sh
source "$count_sh"

work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/test_count.XXXXXX")"
results="$work/results"
output="$work/output"
logs="$work/testlogs"
: >"$results"

# write_log DIR LINES...: a test.log under $logs/DIR with these lines.
write_log() {
  local dir="$logs/$1"
  shift
  mkdir -p "$dir"
  printf '%s\n' "$@" >"$dir/test.log"
}
case_lines() {  # case_lines STATUS NAME: a case's start and end lines
  printf 'CHORUS-CASE start %s\nCHORUS-CASE %s %s\n' "$2" "$1" "$2"
}

cat >"$output" <<'OUT'
INFO: Build completed, 1 test FAILED, 9 total actions
//tests/a:sharded_test                       (2/3 cached) PASSED in 54.4s
  Stats over 3 runs: max = 54.4s, min = 25.9s, avg = 43.0s, dev = 12.3s
//tests/a:plain_test                                   (cached) PASSED in 1.0s
//tests/b:failing_test                                          FAILED in 2.0s
  /root/.cache/bazel/execroot/chorus/bazel-out/k8-opt/testlogs/tests/b/failing_test/test.log
//tests/b:not_catch_test                                        PASSED in 0.5s
//tests/b:stale_test                                   (cached) PASSED in 0.5s
//tests/c:part_test                          (1/2 cached) FAILED in 3.0s
  Stats over 2 runs: max = 3.0s, min = 1.0s, avg = 2.0s, dev = 1.0s
//tests/c:broken_test                                  FAILED TO BUILD
//tests/c:flaky_test                                   FLAKY, failed in 1 out of 2 in 2.0s
  Stats over 2 runs: max = 2.0s, min = 1.0s, avg = 1.5s, dev = 0.5s
//tests/d:sharded_stale_test                           (cached) PASSED in 2.0s
  Stats over 2 runs: max = 2.0s, min = 1.0s, avg = 1.5s, dev = 0.5s
//tests/d:shards_runs_test                                      PASSED in 2.0s
  Stats over 4 runs: max = 2.0s, min = 1.0s, avg = 1.5s, dev = 0.5s
OUT
for s in 1 2 3; do
  write_log "tests/a/sharded_test/shard_${s}_of_3" "$(case_lines passed "s$s one")" "$(case_lines passed "s$s two")"
done
write_log tests/a/plain_test "$(case_lines passed "kept")" "CHORUS-CASE start needs a GPU" \
  "CHORUS-SKIP: no GPU here" "CHORUS-CASE passed needs a GPU"
write_log tests/b/failing_test "$(case_lines passed "fine")" "$(case_lines failed "wrong")" \
  "CHORUS-CASE start crashes" "AddressSanitizer: heap-use-after-free"
write_log tests/b/not_catch_test "a script's own output"
write_log tests/b/stale_test "$(case_lines passed "current")"
write_log tests/b/stale_test/run_1_of_7 "$(case_lines failed "current")" "$(case_lines failed "gone since")"
write_log tests/c/part_test/shard_1_of_2 "$(case_lines passed "p one")"
write_log tests/c/part_test/shard_2_of_2 "$(case_lines failed "p two")"
write_log tests/c/broken_test "$(case_lines passed "from an earlier build")"
write_log tests/c/flaky_test/run_1_of_2 "$(case_lines failed "sometimes")"
write_log tests/c/flaky_test/run_2_of_2 "$(case_lines passed "sometimes")"
# Two shards now; beside them shard_i_of_2_run_j_of_2 folders of an earlier --runs_per_test=2 (as
# many runs as shards: only the product of the two counts tells them apart).
write_log tests/d/sharded_stale_test/shard_1_of_2 "$(case_lines passed "d one")"
write_log tests/d/sharded_stale_test/shard_2_of_2 "$(case_lines passed "d two")"
write_log tests/d/sharded_stale_test/shard_1_of_2_run_1_of_2 "$(case_lines failed "d one")"
write_log tests/d/sharded_stale_test/shard_2_of_2_run_2_of_2 "$(case_lines failed "d gone since")"
# Two shards x two runs now: Bazel's folders shard_i_of_2_run_j_of_2, each read.
for sh in 1 2; do
  for run in 1 2; do
    write_log "tests/d/shards_runs_test/shard_${sh}_of_2_run_${run}_of_2" "$(case_lines passed "sr $sh")"
  done
done

read_run x "$logs" >"$work/printed"

expected="$work/expected"
cat >"$expected" <<'EXP'
x	//tests/a: s1 one	passed
x	//tests/a: s1 two	passed
x	//tests/a: s2 one	passed
x	//tests/a: s2 two	passed
x	//tests/a: s3 one	passed
x	//tests/a: s3 two	passed
x	//tests/a: kept	passed
x	//tests/a: needs a GPU	skipped
x	//tests/b: fine	passed
x	//tests/b: wrong	failed
x	//tests/b: crashes	failed
x	//tests/b:not_catch_test	passed
x	//tests/b: current	passed
x	//tests/c: p one	passed
x	//tests/c: p two	failed
x	//tests/c:broken_test (FAILED TO BUILD)	failed
x	//tests/c: sometimes	failed
x	//tests/c: sometimes	passed
x	//tests/d: d one	passed
x	//tests/d: d two	passed
x	//tests/d: sr 1	passed
x	//tests/d: sr 1	passed
x	//tests/d: sr 2	passed
x	//tests/d: sr 2	passed
EXP
status=0
if ! diff <(sort "$expected") <(sort "$results"); then
  echo "FAILED: the counted lines (>) differ from the expected ones (<)"
  status=1
fi
summary="$(summarize_phase x)"
if [[ "$summary" != "x: 18 passed, 5 failed, 1 skipped" ]]; then
  echo "FAILED: summarize_phase gave '$summary', expected 'x: 18 passed, 5 failed, 1 skipped'"
  status=1
fi
grep -q "needs a GPU: CHORUS-SKIP: no GPU here" "$work/printed" || { echo "FAILED: the skip reason was not printed"; status=1; }
grep -q "crashes: started and never ended" "$work/printed" || { echo "FAILED: the unfinished case was not printed"; status=1; }
rm -rf "$work"
((status == 0)) && echo "test_count_test: every made-up case counted once, as what it is"
exit "$status"
