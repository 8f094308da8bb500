# How tools/test.sh counts test cases (sourced by it; tests/tools:test_count_test sources it too).
# The caller sets $results (a file: one line per test per phase, phase <TAB> test <TAB>
# passed|failed|skipped) and $output (a file: one bazel invocation's console output).

# Catch2 binaries print "CHORUS-CASE start|passed|failed <name>" per case (tests/catch_main.cpp).
# A case is keyed by its package and name, so the ThreadSanitizer twins of a target
# (device_runtime_tsan_test holds sim_runtime_test's and caching_allocator_test's cases) count
# once with it.

# Appends one test log's cases to $results as phase \t package: case \t status. Prints the skip
# reasons and the cases that never ended. Returns 1 when the log has no CHORUS-CASE line.
read_log() {
  local phase="$1" package="$2" log="$3"
  grep -q '^CHORUS-CASE ' "$log" || return 1
  awk -v phase="$phase" -v pkg="$package" -v out="$results" '
    function emit(status, name) { printf "%s\t%s: %s\t%s\n", phase, pkg, name, status >> out }
    /^CHORUS-CASE start / { current = substr($0, 19); skip = ""; next }
    /^CHORUS-SKIP/ { if (current != "") skip = $0; print "  " pkg ": " current ": " $0; next }
    /^CHORUS-CASE (passed|failed) / {
      status = $2
      name = substr($0, length("CHORUS-CASE ") + length(status) + 2)
      if (status == "passed" && skip != "") status = "skipped"
      emit(status, name)
      current = ""; skip = ""
      next
    }
    END {
      if (current != "") {
        print "  " phase ": " pkg ": " current ": started and never ended (crash, timeout or sanitizer report)"
        emit("failed", current)
      }
    }' "$log"
}

# Reads the test targets of one bazel invocation (its output in $output; its test logs under
# $testlogs) into $results. A target's status line: "//pkg:name   PASSED in 3.1s", with
# "(cached) " before the status when Bazel reused the result, or "(2/3 cached) " when it reused
# some shards' results and ran the others (a sharded target after a change that failed one shard;
# until 2026-12-02 the pattern missed that form, and the target's cases went uncounted: an ASan
# phase counted 778 cases for 802, multiprocess_test's missing).
read_run() {
  local phase="$1" testlogs="$2" line label status dir log logs found failed_before n m rel part
  local status_re='^(//[^ ]+:[^ ]+) +(\(([0-9]+/[0-9]+ )?cached\) )?(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|INCOMPLETE|REMOTE FAILURE)'
  # How many logs each target has in this invocation: N from the "Stats over N runs" line under
  # its status line (shards x runs per test), 1 when there is none.
  local -A runs=()
  while read -r label n; do runs["$label"]="$n"; done < <(awk '
    /^\/\/[^ ]+:[^ ]+ / { label = $1; next }
    /^  Stats over [0-9]+ runs/ { if (label != "") print label, $3 }
    { label = "" }' "$output")
  while IFS= read -r line; do
    [[ "$line" =~ $status_re ]] || continue
    label="${BASH_REMATCH[1]}"
    status="${BASH_REMATCH[4]}"
    dir="$testlogs/${label#//}"
    dir="${dir/://}"
    found=0
    failed_before="$(count_failed)"
    # Not built or not run: a log there (if any) is from an earlier build; do not read it.
    if [[ "$status" != "NO STATUS" && "$status" != "FAILED TO BUILD" ]]; then
      # One log per target, or one per shard / run: shard_i_of_S/, run_j_of_R/, or
      # shard_i_of_S_run_j_of_R/ (Bazel's name for both), S x R of them. Folders of another count stay
      # behind from earlier invocations (a --runs_per_test=24 hunt for a flake, a shard count since
      # changed) and are not read: a cached result leaves the target's own test.log as old as it
      # was, so their age does not tell them apart (on 2026-12-02 a cached tsan phase counted session
      # 37's 84 runs of data_test; later that day an ASan phase read a sharded target's
      # shard_i_of_3_run_j_of_3 folders, left by a flake check, as 3 shards: its cases 4 times each).
      n="${runs[$label]:-1}"
      logs=()
      if ((n > 1)); then
        for log in "$dir"/shard_*_of_*/test.log "$dir"/run_*_of_*/test.log; do
          [[ -f "$log" ]] || continue
          m=1  # the product of every _of_N in the log's path below $dir
          rel="${log#"$dir"/}"
          while [[ "$rel" =~ _of_([0-9]+)(.*)$ ]]; do
            m=$((m * BASH_REMATCH[1]))
            rel="${BASH_REMATCH[2]}"
          done
          ((m == n)) && logs+=("$log")
        done
      fi
      ((${#logs[@]})) || logs=("$dir/test.log")
      for log in "${logs[@]}"; do
        [[ -f "$log" ]] && read_log "$phase" "${label%%:*}" "$log" && found=1
      done
    fi
    if [[ "$status" == PASSED || "$status" == FLAKY ]]; then
      # A passing test that is not a Catch2 binary is one passed test.
      ((found)) || printf '%s\t%s\tpassed\n' "$phase" "$label" >>"$results"
    elif [[ "$(count_failed)" == "$failed_before" ]]; then
      # Failed without a failed case of its own (not built, crashed before any case or after the
      # last, a sanitizer report at exit): the target itself is one failed test.
      printf '%s\t%s (%s)\tfailed\n' "$phase" "$label" "$status" >>"$results"
    fi
  done <"$output"
}

count_failed() { awk -F'\t' '$3 == "failed"' "$results" | wc -l; }

summarize_phase() {
  awk -F'\t' -v phase="$1" '$1 == phase { n[$3]++ }
    END { printf "%s: %d passed, %d failed, %d skipped", phase, n["passed"], n["failed"], n["skipped"] }' "$results"
}
