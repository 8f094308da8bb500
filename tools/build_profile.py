#!/usr/bin/env python3
"""Where a Bazel build's time went: the slowest actions of a JSON trace profile.

  python3 tools/build_profile.py PROFILE.gz [--top N]

tools/test.sh writes one profile per phase (~/.cache/chorus/profiles/<phase>.profile.gz). Prints the
wall time the profile covers, the summed duration of actions per kind (compiling, linking, testing),
the compiling split by what is compiled (the library, tests, benchmarks, examples, CUDA), and the N
slowest actions. Summed action time over wall time is how many cores were busy on average.
"""
import argparse
import gzip
import json
from collections import defaultdict


def compiled_kind(name):
    """What a "Compiling ..." action compiles: CUDA (nvcc), benchmarks, tests, examples or library."""
    path = name.split(" ")[-1]
    if " CUDA " in name or path.endswith(".cu"):
        return "CUDA"
    for prefix, kind in (("tests/bench/", "benchmarks"), ("tests/", "tests"), ("examples/", "examples")):
        if path.startswith(prefix):
            return kind
    return "library"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    opener = gzip.open if args.profile.endswith(".gz") else open
    with opener(args.profile, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    actions = []
    first, last = None, None
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        start, dur = e["ts"] / 1e6, e["dur"] / 1e6
        first = start if first is None else min(first, start)
        last = start + dur if last is None else max(last, start + dur)
        # Bazel 4 names an action's span by its progress message ("Compiling x.cpp") in the
        # "action processing" category.
        if e.get("cat") == "action processing":
            actions.append((dur, e.get("name", "?")))
    if not actions:
        raise SystemExit(f"{args.profile}: no 'action processing' spans (is it a JSON trace profile?)")
    by_kind = defaultdict(float)
    for dur, name in actions:
        by_kind[name.split(" ")[0]] += dur
    print(f"{args.profile}: {last - first:.0f} s of wall time, {len(actions)} actions, "
          f"{sum(d for d, _ in actions):.0f} s of action time")
    for kind, total in sorted(by_kind.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {kind:<12} {total:8.0f} s")
    compiled = defaultdict(float)
    for dur, name in actions:
        if name.startswith("Compiling"):
            compiled[compiled_kind(name)] += dur
    if compiled:
        print("compiling, by what is compiled:")
        for kind, total in sorted(compiled.items(), key=lambda kv: -kv[1]):
            print(f"  {kind:<12} {total:8.0f} s")
    print(f"the {args.top} slowest actions:")
    for dur, name in sorted(actions, reverse=True)[:args.top]:
        print(f"  {dur:7.1f} s  {name}")


if __name__ == "__main__":
    main()
