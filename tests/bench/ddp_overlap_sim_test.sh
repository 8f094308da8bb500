#!/usr/bin/env bash
# ddp_overlap_bench --device sim --model tiny: the parent's step alone, then two ranks (processes)
# with DDP over Gloo on their sim devices; a row and a JSON line per rank, every time positive, the
# allreduce measured (the reducer's device events) and the overlapped part within it. A wrong
# option is refused.
set -euo pipefail
bench="${TEST_SRCDIR}/chorus/tests/bench/ddp_overlap_bench"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

if ! "$bench" --device sim --model tiny --steps 4 --warmup 2 >"$tmp/out.txt" 2>&1; then
  cat "$tmp/out.txt"
  fail "ddp_overlap_bench --device sim exited non-zero"
fi
cat "$tmp/out.txt"
rows=$(grep -c '^| ResNet-18 (small input)' "$tmp/out.txt" || true)
[[ "$rows" == 2 ]] || fail "expected a table row per rank, got $rows"
grep '^ddp_overlap_json ' "$tmp/out.txt" | sed 's/^ddp_overlap_json //' >"$tmp/rows.jsonl"
python3 - "$tmp/rows.jsonl" <<'PY' || fail "a rank's figures are missing or out of range"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert sorted(r["rank"] for r in rows) == [0, 1], rows
for r in rows:
    assert r["device"] == "sim:0", r
    assert r["alone_ms"] > 0 and r["plain_ms"] > 0 and r["ddp_ms"] > 0, r
    # Iterations 2-5 (the 4 after the warm-up; the reducer records iterations 0-9) were timed on the
    # device, each with its allreduce.
    assert r["spans"] == 4, r
    assert r["communication_ms"] > 0, r
    assert 0 <= r["overlapped_ms"] <= r["communication_ms"] + 1e-6, r
    assert r["buckets"] >= 1, r
PY
if "$bench" --device sim --model nonsense >"$tmp/bad.txt" 2>&1; then fail "an unknown model was accepted"; fi
grep -q "unknown --model 'nonsense'" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "no clear error for the unknown model"; }
echo "PASS"
