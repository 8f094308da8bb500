#!/usr/bin/env bash
# gpu_bench --device sim: every section runs on the simulated device with tiny shapes, exits 0,
# prints its Markdown table and one JSON row per case, and tools/gpu/compare_bench.py turns the rows
# into its ratio table. A wrong section name is refused.
set -euo pipefail
root="${TEST_SRCDIR}/chorus"
bench="$root/tests/bench/gpu_bench"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

if ! "$bench" --device sim --json "$tmp/rows.jsonl" >"$tmp/out.txt" 2>&1; then
  cat "$tmp/out.txt"
  fail "gpu_bench --device sim exited non-zero"
fi
cat "$tmp/out.txt"
for section in resnet50 bert gpt2 gemm memory conv layers blocks; do
  grep -q "^## $section: " "$tmp/out.txt" || fail "no '## $section' heading"
  rows=$(grep -c "\"impl\":\"chorus\".*\"section\":\"$section\"" "$tmp/rows.jsonl" || true)
  ((rows > 0)) || fail "no chorus row for section $section in the JSON lines"
done
# Counts of the cases each section has at any size: 2 ResNet-50 modes in channels-last and in NCHW, 1 BERT, 1 GPT-2, 7 shapes x 3 modes,
# 5 memory-bound ops (each with its copy row), 23 convolution shapes x 2 modes, 8 layers x 2 modes in
# channels-last and in NCHW.
count() { grep -c "\"impl\":\"$1\".*\"section\":\"$2\"" "$tmp/rows.jsonl" || true; }
[[ $(count chorus resnet50) == 2 ]] || fail "resnet50: $(count chorus resnet50) rows, expected 2"
[[ $(count chorus_nchw resnet50) == 2 ]] || fail "resnet50: $(count chorus_nchw resnet50) NCHW rows, expected 2"
[[ $(count chorus bert) == 1 ]] || fail "bert: $(count chorus bert) rows, expected 1"
[[ $(count chorus gpt2) == 1 ]] || fail "gpt2: $(count chorus gpt2) rows, expected 1"
[[ $(count chorus gemm) == 21 ]] || fail "gemm: $(count chorus gemm) rows, expected 21"
[[ $(count chorus memory) == 5 && $(count copy memory) == 5 ]] || fail "memory: expected 5 chorus and 5 copy rows"
[[ $(count chorus conv) == 46 ]] || fail "conv: $(count chorus conv) rows, expected 46"
[[ $(count chorus layers) == 16 && $(count chorus_nchw layers) == 16 ]] ||
  fail "layers: $(count chorus layers) channels-last and $(count chorus_nchw layers) NCHW rows, expected 16 each"
# blocks: the stem, 16 bottlenecks and the head, in tf32 and bf16, channels-last and NCHW.
[[ $(count chorus blocks) == 36 && $(count chorus_nchw blocks) == 36 ]] ||
  fail "blocks: $(count chorus blocks) channels-last and $(count chorus_nchw blocks) NCHW rows, expected 36 each"
# No raw library on sim, and the output says so.
[[ $(count cublas gemm) == 0 && $(count cudnn conv) == 0 ]] || fail "raw library rows on sim"
grep -q "Raw cuBLAS/cuDNN baselines need a CUDA device" "$tmp/out.txt" || fail "no note on the missing raw rows"
# Every figure measured: positive milliseconds and throughput, peaks on the chorus rows.
python3 - "$tmp/rows.jsonl" <<'PY' || fail "a row with a non-positive figure or no peak"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    assert r["ms"] > 0 and r["value"] > 0, r
    if r["impl"] in ("chorus", "chorus_nchw"):
        assert r["peak_allocated_mib"] > 0 and r["peak_reserved_mib"] >= r["peak_allocated_mib"], r
PY

python3 "$root/tools/gpu/compare_bench.py" "$tmp/out.txt" >"$tmp/compare.txt" || { cat "$tmp/compare.txt"; fail "compare_bench.py failed"; }
cat "$tmp/compare.txt"
grep -q "chorus / copy" "$tmp/compare.txt" || fail "compare_bench.py printed no bandwidth ratio"
grep -q "no PyTorch row" "$tmp/compare.txt" || fail "compare_bench.py did not say PyTorch's rows are missing"

if "$bench" --device sim --only gemm,nonsense >"$tmp/bad.txt" 2>&1; then fail "an unknown section was accepted"; fi
grep -q "unknown section 'nonsense'" "$tmp/bad.txt" || fail "no message for the unknown section"
echo "PASS"
