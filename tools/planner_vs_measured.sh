#!/usr/bin/env bash
# The DAPPLE planner's predictions against measured iterations on this machine (docs/pipeline.md,
# "Predictions against measurements"): profiles the planner tool's MLP (8 layers, --hidden H) at the
# micro-batch sizes used, calibrates the links of 2 processes with `calibrate`, lets the planner
# choose plans for M = 2, 4, 8, and runs 11 hand-written plans and the 3 chosen ones 3 times each
# with pipeline_bench --plans (global batch 256). Prints a table, the Spearman rank correlation and
# how many pairs of plans predicted >10% apart are measured in the same order.
#
#   bash tools/planner_vs_measured.sh [HIDDEN=1024] [OUT_DIR]
#   bash tools/planner_vs_measured.sh gpt [OUT_DIR]
# The second form does the same for GPT-2 mini as its 6 pipeline blocks (embeddings, h.0-h.3, the
# tied head; sequences of 128, global batch 16, micro-batches 1-16): `profile --model gpt` and
# `pipeline_bench --plans --model gpt`, with the hand-written plans cut at blocks 1-5.
# Builds what it runs (bazel -c opt). About 40 s at hidden 1024 on a 2-core machine; about 8 minutes
# for gpt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
H="${1:-1024}"
OUT="${2:-$(mktemp -d)}"
if [ "$H" = gpt ]; then
  L=6 GB=16 CUTS="3 2 4 1 5" MAIN=3
  PROFILE=(--model gpt --config mini --seq-len 128 --batch 16 --batches 1,2,4,8,16)
  BENCH=(--model gpt --config mini --seq-len 128)
else
  L=8 GB=256 CUTS="4 2 3 6 7" MAIN=4
  PROFILE=(--model mlp --hidden "$H" --depth 8 --batch 128 --batches 8,16,32,64,256)
  BENCH=(--hidden "$H")
fi
mkdir -p "$OUT"
bazel build -c opt //distributed/pipeline/planner:profile //distributed/pipeline/planner:plan \
  //distributed/pipeline/planner:calibrate //distributed/launcher:chorusrun //tests/bench:pipeline_bench >/dev/null 2>&1
B="$PWD/bazel-bin"
P="$B/distributed/pipeline/planner"
cd "$OUT"
plan() {  # name micro_batches schedule stages-json
  echo "{\"version\":1,\"num_layers\":$L,\"global_batch\":$GB,\"micro_batches\":$2,\"schedule\":\"$3\",\"stages\":$4}" >"$1.json"
}
two() { echo "[{\"layers\":[0,$1],\"ranks\":[0]},{\"layers\":[$1,$L],\"ranks\":[1]}]"; }
# Plans are named p<blocks of stage 0><blocks of stage 1>[g: GPipe][m<M>: other than 4 micro-batches].
plan dp 1 1f1b "[{\"layers\":[0,$L],\"ranks\":[0,1]}]"
plan dp4 4 1f1b "[{\"layers\":[0,$L],\"ranks\":[0,1]}]"
PM="p$MAIN$((L - MAIN))"
plan "${PM}g" 4 gpipe "$(two $MAIN)"
plan "$PM" 4 1f1b "$(two $MAIN)"
plan "${PM}m2" 2 1f1b "$(two $MAIN)"
plan "${PM}m8" 8 1f1b "$(two $MAIN)"
plan "${PM}m16" 16 1f1b "$(two $MAIN)"
OTHERS=""
for c in $CUTS; do
  [ "$c" = "$MAIN" ] && continue
  plan "p$c$((L - c))" 4 1f1b "$(two "$c")"
  OTHERS="$OTHERS p$c$((L - c))"
done
"$P/profile" "${PROFILE[@]}" --threads 1 --repeats 7 --optimizer sgd --no-memory --out profile.json >profile.txt
"$B/distributed/launcher/chorusrun" --nproc-per-node 2 "$P/calibrate" --out cluster.json >calibrate.txt 2>&1
PLANS="dp dp4 ${PM}g $PM ${PM}m2 ${PM}m8 ${PM}m16$OTHERS"
for M in 2 4 8; do
  "$P/plan" --profile profile.json --cluster cluster.json --optimizer-states 1 --global-batch $GB --micro-batches $M \
    --out "choice$M.json" >"choice$M.txt"
  PLANS="$PLANS choice$M"
done
files=()
for p in $PLANS; do files+=("$p.json"); done
for r in 1 2 3; do
  "$B/distributed/launcher/chorusrun" --nproc-per-node 2 "$B/tests/bench/pipeline_bench" --plans --steps 10 \
    "${BENCH[@]}" "${files[@]}" >"measured$r.txt" 2>&1
done
for p in $PLANS; do
  echo "$p $("$P/plan" --profile profile.json --cluster cluster.json --optimizer-states 1 --evaluate "$p.json" |
    awk '/^iteration/ {print $2}')"
done >predicted.txt
grep -E "latency|overlap" calibrate.txt | sed 's/^\[0\]: //'
python3 - "$PLANS" <<'PY'
import re, statistics, sys
names = sys.argv[1].split()
pred = dict((l.split()[0], float(l.split()[1])) for l in open("predicted.txt"))
runs = []
for r in (1, 2, 3):
    d = {}
    for l in open(f"measured{r}.txt"):
        m = re.match(r"\[0\]: \| (\S+)\.json \| (.*?) \| (\d+) \| (\S+) \| ([\d.]+) \|", l)
        if m: d[m.group(1)] = (float(m.group(5)), m.group(2), m.group(3), m.group(4))
    runs.append(d)
def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i]); r = [0.0] * len(v); i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]: j += 1
        for k in range(i, j + 1): r[order[k]] = (i + j) / 2
        i = j + 1
    return r
def spearman(a, b):
    ra, rb = ranks(a), ranks(b); n = len(a); ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
print("| plan | stages | M | schedule | predicted ms | measured ms (3 runs) | median / predicted |")
print("|---|---|---|---|---|---|---|")
med = {}
for n in names:
    v = [r[n][0] for r in runs]; med[n] = statistics.median(v)
    print(f"| {n} | {runs[0][n][1]} | {runs[0][n][2]} | {runs[0][n][3]} | {pred[n]:.2f} | "
          f"{' / '.join('%.2f' % x for x in v)} | {med[n] / pred[n]:.2f} |")
base = [n for n in names if not n.startswith("choice")]
print("Spearman over the %d hand-written plans: medians %.3f; runs %s" % (len(base),
    spearman([pred[n] for n in base], [med[n] for n in base]),
    " ".join("%.3f" % spearman([pred[n] for n in base], [r[n][0] for n in base]) for r in runs)))
agree = total = 0; bad = []
for i, a in enumerate(base):
    for b in base[i + 1:]:
        if abs(pred[a] - pred[b]) > 0.10 * min(pred[a], pred[b]):
            total += 1
            if (pred[a] < pred[b]) == (med[a] < med[b]): agree += 1
            else: bad.append(f"{a}/{b}")
print(f"pairs predicted >10% apart: {agree} of {total} measured in the same order; not: {' '.join(bad) or '-'}")
PY
for M in 2 4 8; do grep "chosen plan" "choice$M.txt" | sed "s/^/M = $M: /"; done
echo "(files in $OUT)"
