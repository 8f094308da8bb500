#!/usr/bin/env bash
# Runs a chorus GPU bundle (made by tools/gpu_bundle.sh) on a machine with a GPU: every gpu test,
# then each again under compute-sanitizer memcheck and racecheck, then gpu_bench with its PyTorch twin
# (torch_peer.py) and their ratio table (compare_bench.py), then every other GPU benchmark, then
# PyTorch's figures for the same work (peer.py), the ResNet-50 and BERT-base examples on synthetic
# batches (--device cuda, float32 and bf16 autocast), and writes logs plus summary.txt into LOG_DIR
# (default $OUT, else ./gpu_logs). The CUDA libraries come from the PyTorch wheels (nvidia/*/lib).
# GPU_BENCH_ONLY=gemm,conv (say) limits gpu_bench and torch_peer.py to those sections.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The bundle's binaries and libraries come compressed (tools/gpu_bundle.sh): unpack them into a
# temporary folder (the bundle folder may be read-only) and run from there.
if [[ -f "$here/payload.tar.xz" ]]; then
  unpack="$(mktemp -d)"
  xz -dc "$here/payload.tar.xz" | tar -C "$unpack" -xf -
  cp "$here/peer.py" "$here/torch_peer.py" "$here/compare_bench.py" "$unpack/"
  here="$unpack"
fi
logs="${1:-${OUT:-$PWD/gpu_logs}}"
mkdir -p "$logs"
summary="$logs/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

if ! nvidia-smi -L >/dev/null 2>&1; then
  say "run.sh: no CUDA device: nvidia-smi finds no GPU on this machine; nothing was run"
  exit 2
fi
say "date: $(date -u +%Y-%m-%dT%H:%MZ)"
say "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"

# CUDA libraries: the PyTorch wheels' nvidia/*/lib folders, else the system's.
cuda_libs="$(python3 - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
print(":".join(sorted(d for r in roots for d in glob.glob(os.path.join(r, "*", "lib")))))
EOF
)"
export LD_LIBRARY_PATH="$here/lib:${cuda_libs}:${LD_LIBRARY_PATH:-}"
say "cuda libraries from: ${cuda_libs:-system}"

pass=0
fail=0
run_one() {  # name log command...
  local name="$1" log="$2"
  shift 2
  if "$@" >"$log" 2>&1; then
    pass=$((pass + 1))
    say "PASS $name"
  else
    fail=$((fail + 1))
    say "FAIL $name (exit $?; log $(basename "$log"))"
  fi
}

for bin in "$here"/bin/*; do
  name="$(basename "$bin")"
  [[ "$name" == *_bench ]] && continue
  run_one "$name" "$logs/$name.log" "$bin"
done

sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
if [[ -n "$sanitizer" ]]; then
  for bin in "$here"/bin/*; do
    name="$(basename "$bin")"
    [[ "$name" == *_bench ]] && continue
    for tool in memcheck racecheck; do
      run_one "$name under $tool" "$logs/$name.$tool.log" "$sanitizer" --tool "$tool" --error-exitcode 99 "$bin"
    done
  done
else
  say "compute-sanitizer not found: sanitizer runs skipped"
fi

# chorus and PyTorch on the same sections and shapes in this one call, then the ratios with issue
# 17's goals marked; the JSON rows and the table stay in $logs beside the archive.
if [[ -x "$here/bin/gpu_bench" ]]; then
  only="${GPU_BENCH_ONLY:-resnet50,bert,gemm,memory,conv}"
  run_one "gpu_bench" "$logs/gpu_bench.log" timeout 1200 "$here/bin/gpu_bench" --only "$only" --json "$logs/gpu_bench.jsonl"
  if python3 -c 'import torch' 2>/dev/null; then
    run_one "torch_peer.py" "$logs/torch_peer.log" timeout 1200 python3 "$here/torch_peer.py" --only "$only" \
      --json "$logs/torch_peer.jsonl"
  else
    say "torch_peer.py skipped: python3 has no torch"
  fi
  python3 "$here/compare_bench.py" "$logs/gpu_bench.jsonl" "$logs/torch_peer.jsonl" >"$logs/gpu_bench_compare.md" 2>&1
  cat "$logs/gpu_bench_compare.md" >>"$summary"
fi

for bin in "$here"/bin/*_bench; do
  [[ -e "$bin" ]] || continue
  name="$(basename "$bin")"
  [[ "$name" == gpu_bench ]] && continue  # run above, beside PyTorch
  run_one "$name" "$logs/$name.log" "$bin"
  tail -n 40 "$logs/$name.log" >>"$summary"
done

# The examples on the GPU (--device cuda, synthetic batches: no datasets here): a few steps each in
# float32 and under bf16 autocast; the summary line of each goes into summary.txt.
example() {  # name command...
  local name="$1"
  shift
  run_one "$name" "$logs/$name.log" timeout 600 "$@"
  grep -h '"summary"' "$logs/$name.log" >>"$summary" || true
}
for amp in none bf16; do
  example "resnet50 synthetic amp=$amp" "$here/examples/resnet" --synthetic --device cuda --amp "$amp" --arch resnet50 \
    --image-size 224 --batch-size 32 --steps 10 --warmup 3 --log-every 30
  example "bert-base synthetic amp=$amp" "$here/examples/bert" --synthetic --device cuda --amp "$amp" --config base \
    --seq-len 128 --batch-size 32 --steps 10 --eval-sequences 0 --data-dir "$here/data" --log-every 30
done

if python3 -c 'import torch' 2>/dev/null; then
  run_one "peer.py (PyTorch $(python3 -c 'import torch; print(torch.__version__)'))" "$logs/peer.log" python3 "$here/peer.py"
  cat "$logs/peer.log" >>"$summary"
fi

say "$pass passed, $fail failed"
# At most 8 files come back from the device tool: keep the summary and one archive of every log.
tar -czf "$logs/logs.tar.gz" -C "$logs" --exclude=logs.tar.gz --exclude=summary.txt . 2>/dev/null
find "$logs" -name '*.log' -delete
((fail == 0))
