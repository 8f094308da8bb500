"""Puts chorus's gpu_bench rows beside PyTorch's (tools/torch_peer.py) and the raw libraries', with the
goals of issue 17 marked:
  resnet50, bert, gpt2
                  chorus / PyTorch throughput >= 1 (PyTorch's channels-last rows for ResNet-50; its
                  NCHW rows shown beside) at chorus / PyTorch peak allocated memory <= 1
  gemm, conv      chorus / raw library (cuBLAS, cuDNN) >= 0.95; chorus / PyTorch shown beside
  memory          chorus GB/s / device-to-device copy GB/s >= 0.80 (PyTorch's kernel / its copy beside)
  layers, blocks  no goal: channels-last against NCHW per op (per block of the ResNet-50 step), both sides

    python3 tools/gpu/compare_bench.py gpu_bench.log torch_peer.log [...]

Reads every line of the files that is a gpu_bench JSON row ({"gpu_bench": "row", ...}) and ignores the
rest, so whole logs can be given. Rows pair by (section, case). Prints Markdown; exits 1 only when no
row was found (a benchmark is not a pass/fail test).
"""
import json
import os
import sys

GOALS = {"throughput": 1.0, "memory": 1.0, "library": 0.95, "bandwidth": 0.80}


def read_rows(paths):
    rows = {}
    for path in paths:
        if not os.path.exists(path):
            print(f"compare_bench.py: {path} not found, left out", file=sys.stderr)
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(r, dict) and r.get("gpu_bench") == "row":
                    rows[(r["section"], r["case"], r["impl"])] = r
    return rows


def cases(rows, section):
    seen = []
    for (s, case, impl) in rows:
        if s == section and impl == "chorus" and case not in seen:
            seen.append(case)
    return seen


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def fmt(x, digits=3):
    if x is None:
        return ""
    return f"{x:.{digits}g}" if abs(x) >= 1000 or abs(x) < 0.01 else f"{x:.{digits}f}"


def mib(x):
    return "" if x is None else f"{x:.0f}"


class Tally:
    def __init__(self):
        self.met = self.missed = self.unpaired = 0

    def mark(self, value, goal, at_least=True):
        if value is None:
            self.unpaired += 1
            return "no pair"
        ok = value >= goal if at_least else value <= goal
        if ok:
            self.met += 1
            return "met"
        self.missed += 1
        return "**missed**"


def value(rows, section, case, impl, key="value"):
    r = rows.get((section, case, impl))
    return None if r is None else r.get(key)


def models(rows, section, tally, out):
    out.append(f"\n## {section}: chorus / PyTorch eager (goals: throughput >= {GOALS['throughput']}, "
               f"peak allocated <= {GOALS['memory']})\n")
    out.append("| case | chorus | PyTorch | chorus / PyTorch | goal | chorus NCHW | PyTorch NCHW | NCHW ratio "
               "| chorus peak MiB | PyTorch peak MiB | memory ratio | goal |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case in cases(rows, section):
        c, t, cn, tn = (value(rows, section, case, i) for i in ("chorus", "torch", "chorus_nchw", "torch_nchw"))
        cm, tm = value(rows, section, case, "chorus", "peak_allocated_mib"), value(rows, section, case, "torch",
                                                                                    "peak_allocated_mib")
        unit = rows[(section, case, "chorus")]["unit"]
        r, rm = ratio(c, t), ratio(cm, tm)
        out.append(f"| {case} | {fmt(c)} {unit} | {fmt(t) if t is not None else 'no PyTorch row'} | {fmt(r)} | "
                   f"{tally.mark(r, GOALS['throughput'])} | {fmt(cn)} | {fmt(tn)} | {fmt(ratio(cn, tn))} | {mib(cm)} | "
                   f"{mib(tm)} | {fmt(rm)} | {tally.mark(rm, GOALS['memory'], at_least=False)} |")


def library(rows, section, lib, tally, out):
    out.append(f"\n## {section}: chorus / {lib} (goal >= {GOALS['library']}), chorus / PyTorch beside\n")
    out.append(f"| case | chorus | {lib} | chorus / {lib} | goal | PyTorch | chorus / PyTorch | chorus note "
               f"| {lib} note |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for case in cases(rows, section):
        c, raw, t = (value(rows, section, case, i) for i in ("chorus", lib, "torch"))
        r = ratio(c, raw)
        notes = [rows.get((section, case, i), {}).get("note", "") for i in ("chorus", lib)]
        out.append(f"| {case} | {fmt(c)} | {fmt(raw) if raw is not None else 'no ' + lib + ' row'} | {fmt(r)} | "
                   f"{tally.mark(r, GOALS['library'])} | {fmt(t) if t is not None else 'no PyTorch row'} | "
                   f"{fmt(ratio(c, t))} | {notes[0]} | {notes[1]} |")


def bandwidth(rows, section, tally, out):
    out.append(f"\n## {section}: GB/s / device-to-device copy GB/s of the same size (goal >= {GOALS['bandwidth']})\n")
    out.append("| case | chorus GB/s | copy GB/s | chorus / copy | goal | PyTorch GB/s | PyTorch / its copy "
               "| chorus / PyTorch |")
    out.append("|---|---|---|---|---|---|---|---|")
    for case in cases(rows, section):
        c, cp, t, tcp = (value(rows, section, case, i) for i in ("chorus", "copy", "torch", "torch_copy"))
        r = ratio(c, cp)
        out.append(f"| {case} | {fmt(c)} | {fmt(cp)} | {fmt(r)} | {tally.mark(r, GOALS['bandwidth'])} | "
                   f"{fmt(t) if t is not None else 'no PyTorch row'} | {fmt(ratio(t, tcp))} | {fmt(ratio(c, t))} |")



def layers(rows, section, out, what="op"):
    """A diagnosis, no goals: each op (or block) channels-last against NCHW, chorus's and PyTorch's side
    by side."""
    out.append(f"\n## {section}: channels-last / NCHW of each {what} (no goal: where channels-last loses time)\n")
    out.append("| case | chorus | chorus NCHW | chorus CL / NCHW | PyTorch | PyTorch NCHW | PyTorch CL / NCHW "
               "| chorus / PyTorch (CL) |")
    out.append("|---|---|---|---|---|---|---|---|")
    for case in cases(rows, section):
        c, cn, t, tn = (value(rows, section, case, i) for i in ("chorus", "chorus_nchw", "torch", "torch_nchw"))
        out.append(f"| {case} | {fmt(c)} | {fmt(cn)} | {fmt(ratio(c, cn))} | "
                   f"{fmt(t) if t is not None else 'no PyTorch row'} | {fmt(tn)} | {fmt(ratio(t, tn))} | "
                   f"{fmt(ratio(c, t))} |")

def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    rows = read_rows(argv)
    if not rows:
        print("compare_bench.py: no gpu_bench rows in " + ", ".join(argv), file=sys.stderr)
        return 1
    tally, out = Tally(), []
    devices = sorted({r["device"] for r in rows.values()})
    out.append(f"# gpu_bench: chorus against PyTorch and the raw libraries ({', '.join(devices)})")
    if not all(d.startswith("cuda") for d in devices):
        out.append("\nNot a GPU comparison (rows from " + ", ".join(devices) + "): the ratios and goal marks "
                   "below only show that the rows pair up; they say nothing about chorus on a GPU.")
    sections = {s for (s, _, _) in rows}
    for section in ("resnet50", "bert", "gpt2"):
        if section in sections:
            models(rows, section, tally, out)
    if "gemm" in sections:
        library(rows, "gemm", "cublas", tally, out)
    if "memory" in sections:
        bandwidth(rows, "memory", tally, out)
    if "conv" in sections:
        library(rows, "conv", "cudnn", tally, out)
    if "layers" in sections:
        layers(rows, "layers", out)
    if "blocks" in sections:
        layers(rows, "blocks", out, what="block of the ResNet-50 step")
    out.append(f"\ngoals met: {tally.met}, missed: {tally.missed}, without the row to compare with: {tally.unpaired}")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
