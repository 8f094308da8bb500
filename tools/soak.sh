#!/usr/bin/env bash
# Soak test (docs/reliability.md, "Soak"): 2-process DDP training of the MNIST MLP for EPOCHS epochs
# of batch 64 (22 epochs = 20,636 steps), a checkpoint every 500 steps, twice: once uninterrupted,
# once with one worker killed (SIGKILL) in the middle and brought back by chorusrun --max-restarts 1
# with --resume auto. Every second it samples each worker's resident memory, threads and open file
# descriptors (/proc); it reports their growth from the end of the first epoch to the end, and
# whether the two runs end with the same checkpoint, byte for byte.
#
#   bash tools/soak.sh [EPOCHS, default 22]        (about 4 minutes per run on 2 cores)
#
# With --load (issue 35 item 5) it runs one job instead: world size 8 on sim devices (the stream-order
# sanitizer on, as it is for sim by default), global batch 512, STEPS steps (default 2,000), and
# reports the same growth figures for the 8 workers.
#
#   bash tools/soak.sh --load [STEPS, default 2000]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
load=0
if [[ "${1:-}" == "--load" ]]; then
  load=1
  shift
fi
epochs="${1:-22}"  # with --load: steps
((load)) && epochs="${1:-2000}"
bazel build -c opt //examples/mnist //distributed/launcher:chorusrun >/dev/null 2>&1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
flags=(--model mlp --epochs "$epochs" --batch-size 64 --threads 1 --workers 0 --log-every 30
       --checkpoint-every 500 --resume auto)

# Samples "seconds pid rss_kib threads fds" for every child of $1 until it exits.
sample() {
  local launcher="$1" out="$2" t=0 pid
  while kill -0 "$launcher" 2>/dev/null; do
    for pid in $(pgrep -P "$launcher" || true); do
      [[ -r /proc/$pid/status ]] || continue
      local rss threads fds
      rss="$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null)" || continue
      threads="$(awk '/^Threads/ {print $2}' "/proc/$pid/status" 2>/dev/null)" || continue
      fds="$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)"
      [[ -n "$rss" ]] && echo "$t $pid $rss $threads $fds" >>"$out"
    done
    sleep 1
    t=$((t + 1))
  done
}

# run NAME [KILL_AT_EPOCH]
run() {
  local name="$1" kill_epoch="${2:-}" dir="$work/$1" start end
  mkdir -p "$dir"
  start=$(date +%s)
  if ((load)); then
    CHORUS_STREAM_SANITIZER=1 bazel-bin/distributed/launcher/chorusrun --nproc-per-node 8 \
      bazel-bin/examples/mnist/mnist --model mlp --device sim --batch-size 512 --epochs 1000 --max-steps "$epochs" \
      --threads 1 --workers 0 --log-every 30 --checkpoint-every 500 --checkpoint-dir "$dir" >"$dir/log" 2>&1 &
  else
    bazel-bin/distributed/launcher/chorusrun --max-restarts 1 --nproc-per-node 2 \
      bazel-bin/examples/mnist/mnist "${flags[@]}" --checkpoint-dir "$dir" >"$dir/log" 2>&1 &
  fi
  local launcher=$!
  sample "$launcher" "$dir/samples" &
  local sampler=$!
  if [[ -n "$kill_epoch" ]]; then
    until grep -q "at epoch $kill_epoch step" "$dir/log" 2>/dev/null; do sleep 0.2; done
    sleep 1  # some steps past the checkpoint: lost, and redone after the restart
    local victim
    victim="$(pgrep -P "$launcher" | tail -n 1)"
    kill -9 "$victim"
    echo "soak: $name: killed worker $victim with SIGKILL at epoch $kill_epoch"
  fi
  local rc=0
  wait "$launcher" || rc=$?
  wait "$sampler" || true
  end=$(date +%s)
  echo "soak: $name: exit $rc after $((end - start)) s; $(grep -c 'saved .*checkpoint' "$dir/log") checkpoints saved;" \
    "last: $(grep -E 'test accuracy|accuracy' "$dir/log" | tail -n 1)"
  # Per worker process: the sample a tenth of the way through its life (warm: data loaded, first
  # steps taken) against the one 95% through (before the final evaluation and exit), and the peak.
  sort -k2,2n -k1,1n "$dir/samples" | awk '
    { k = n[$2] + 0; t[$2, k] = $1; r[$2, k] = $3; th[$2, k] = $4; fd[$2, k] = $5; n[$2] = k + 1;
      if ($3 > peak[$2]) peak[$2] = $3 }
    END { for (p in n) { a = int(n[p] / 10); b = int(n[p] * 95 / 100);
            printf "soak:   worker %s (%d samples): RSS %d -> %d KiB (%+d KiB over %d s), peak %d KiB; threads %d -> %d; fds %d -> %d\n",
                   p, n[p], r[p, a], r[p, b], r[p, b] - r[p, a], t[p, b] - t[p, a], peak[p], th[p, a], th[p, b],
                   fd[p, a], fd[p, b] } }'
  return $rc
}

status=0
if ((load)); then
  run load || status=1
  grep -h "step\|error\|sanitizer" "$work/load/log" | tail -n 3 | sed 's/^/soak:   /'
  exit $status
fi
run uninterrupted || status=1
run killed $((epochs / 2)) || status=1
if cmp -s "$work/uninterrupted/checkpoint.safetensors" "$work/killed/checkpoint.safetensors"; then
  echo "soak: final checkpoints identical ($(stat -c %s "$work/killed/checkpoint.safetensors") bytes)"
else
  echo "soak: final checkpoints DIFFER"
  status=1
fi
grep -h "restarting\|resumed from" "$work/killed/log" | sed 's/^/soak:   /' | head -5
exit $status
