#!/usr/bin/env python3
"""Plots the scalars of TensorBoard event files where TensorBoard is not installed.

    python3 tools/plot.py RUN_DIR [RUN_DIR ...] [-o curves.png] [--tags loss,accuracy] [--dump]

Reads every events.out.tfevents.* file under each RUN_DIR, recursively (so the sub-runs
SummaryWriter.add_scalars and add_hparams write are there too), and draws one subplot per scalar tag
with one line per run: the run's label is the RUN_DIR's name, plus "/<sub-directory>" for a sub-run;
x is the step. Several files of one run (a restarted job) are one line, sorted by step.

--dump prints the scalars as JSON instead of (or, with -o, besides) plotting:
    {"<run label>": {"<tag>": [[step, value], ...]}}
--tags keeps only the named tags (comma-separated, exact names).

Self-contained: a small protobuf wire decoder and CRC-32C check of its own, no TensorBoard or protobuf
package; matplotlib (Agg backend) only to draw. A truncated last record (a writer killed
mid-append) is skipped with a warning; a record whose CRC does not match stops with an error naming
the file and byte offset. docs/tensorboard.md describes the format.
"""

import argparse
import json
import math
import os
import struct
import sys

# --- TFRecord framing: uint64 length, masked CRC-32C of it, data, masked CRC-32C of data -----------
_CRC_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def _masked_crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class CorruptFile(Exception):
    pass


def records(path, warn):
    """The data of each whole record of an event file."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0
    while pos < len(buf):
        if len(buf) - pos < 12:
            warn(f"{path}: ignoring a truncated last record at byte offset {pos}")
            return
        length = struct.unpack_from("<Q", buf, pos)[0]
        stored = struct.unpack_from("<I", buf, pos + 8)[0]
        if stored != _masked_crc32c(buf[pos:pos + 8]):
            raise CorruptFile(f"{path}: CRC mismatch in the length of the record at byte offset {pos}")
        end = pos + 12 + length + 4
        if end > len(buf):
            warn(f"{path}: ignoring a truncated last record at byte offset {pos}")
            return
        data = buf[pos + 12:pos + 12 + length]
        if struct.unpack_from("<I", buf, end - 4)[0] != _masked_crc32c(data):
            raise CorruptFile(f"{path}: CRC mismatch in the data of the record at byte offset {pos}")
        yield data
        pos = end


# --- protobuf wire format ------------------------------------------------------------------------
def _varint(buf, pos):
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def fields(buf):
    """(field number, wire type, payload) of each field of a message: payloads are ints for
    varints, bytes otherwise (8 for fixed64, 4 for fixed32)."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"wire type {wire} not supported")
        yield number, wire, value


# Field numbers (tensorboard/compat/proto/event.proto, summary.proto, tensor.proto).
EVENT_STEP, EVENT_SUMMARY = 2, 5
SUMMARY_VALUE = 1
VALUE_TAG, VALUE_SIMPLE, VALUE_TENSOR, VALUE_METADATA = 1, 2, 8, 9
METADATA_PLUGIN_DATA, PLUGIN_NAME = 1, 1
TENSOR_FLOAT_VAL, TENSOR_DOUBLE_VAL = 5, 6


def _first_number(payload, fmt):
    """The first element of a repeated float/double field (packed or not)."""
    size = struct.calcsize(fmt)
    return struct.unpack_from(fmt, payload)[0] if len(payload) >= size else None


def scalars_of_event(data):
    """(step, [(tag, value)]) of an Event's scalar summary values."""
    step, found = 0, []
    for number, _, payload in fields(data):
        if number == EVENT_STEP:
            step = payload - (1 << 64) if payload >= 1 << 63 else payload
        elif number == EVENT_SUMMARY:
            for vnum, _, value in fields(payload):
                if vnum != SUMMARY_VALUE:
                    continue
                tag, simple, tensor_scalar, plugin = None, None, None, ""
                for f, wire, p in fields(value):
                    if f == VALUE_TAG:
                        tag = p.decode("utf-8", "replace")
                    elif f == VALUE_SIMPLE:
                        simple = struct.unpack("<f", p)[0]
                    elif f == VALUE_TENSOR:
                        for tf, _, tp in fields(p):
                            if tf == TENSOR_FLOAT_VAL:
                                tensor_scalar = _first_number(tp, "<f")
                            elif tf == TENSOR_DOUBLE_VAL:
                                tensor_scalar = _first_number(tp, "<d")
                    elif f == VALUE_METADATA:
                        for mf, _, mp in fields(p):
                            if mf == METADATA_PLUGIN_DATA:
                                for pf, _, pp in fields(mp):
                                    if pf == PLUGIN_NAME:
                                        plugin = pp.decode("utf-8", "replace")
                if tag is None:
                    continue
                if simple is not None:
                    found.append((tag, simple))
                elif plugin == "scalars" and tensor_scalar is not None:  # PyTorch's new_style scalars
                    found.append((tag, tensor_scalar))
    return step, found


# --- runs ----------------------------------------------------------------------------------------
def read_runs(run_dirs, warn):
    """{label: {tag: [(step, value), ...]}} over every event file under the run directories."""
    runs = {}
    for run_dir in run_dirs:
        if not os.path.isdir(run_dir):
            raise FileNotFoundError(f"{run_dir}: not a directory")
        base = os.path.basename(os.path.normpath(run_dir))
        for dirpath, dirnames, filenames in os.walk(run_dir):
            dirnames.sort()
            rel = os.path.relpath(dirpath, run_dir)
            label = base if rel == "." else base + "/" + rel.replace(os.sep, "/")
            for name in sorted(filenames):
                if not name.startswith("events.out.tfevents."):
                    continue
                for data in records(os.path.join(dirpath, name), warn):
                    step, found = scalars_of_event(data)
                    for tag, value in found:
                        runs.setdefault(label, {}).setdefault(tag, []).append((step, value))
    for tags in runs.values():
        for points in tags.values():
            points.sort(key=lambda p: p[0])  # stable: equal steps keep file order
    return runs


def smoothed(values, weight):
    """TensorBoard's smoothing: an exponential moving average with its start-up bias removed."""
    out, last, debias = [], 0.0, 0.0
    for v in values:
        last = last * weight + (1 - weight) * v
        debias = debias * weight + (1 - weight)
        out.append(last / debias)
    return out


def plot(runs, tags, out, smooth=0.0):
    try:
        import matplotlib
    except ImportError as e:
        sys.stderr.write(f"plot.py: matplotlib is missing ({e}): install python3-matplotlib (tools/setup.sh does)\n")
        sys.exit(3)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(tags))
    rows = math.ceil(len(tags) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.5 * rows), squeeze=False)
    for i, tag in enumerate(tags):
        ax = axes[i // cols][i % cols]
        for label in sorted(runs):
            points = runs[label].get(tag)
            if points:
                steps, values = [p[0] for p in points], [p[1] for p in points]
                # A few points (an evaluation per epoch) are drawn as they are: averaging them would
                # move the last one far from its value.
                if smooth > 0 and len(points) >= 20:
                    line, = ax.plot(steps, values, alpha=0.25, linewidth=0.8)
                    ax.plot(steps, smoothed(values, smooth), label=label, color=line.get_color())
                else:
                    ax.plot(steps, values, label=label)
        ax.set_title(tag)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for j in range(len(tags), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("-o", "--output", help="the PNG to write (default curves.png unless --dump)")
    parser.add_argument("--tags", help="comma-separated tags to keep (default: all)")
    parser.add_argument("--dump", action="store_true", help="print the scalars as JSON")
    parser.add_argument("--smooth", type=float, default=0.0,
                        help="TensorBoard's smoothing weight in [0, 1) (e.g. 0.9) for series of 20 points or more: the raw "
                             "values faint, the moving average drawn over them (default 0: raw)")
    args = parser.parse_args(argv)
    if not 0 <= args.smooth < 1:
        sys.stderr.write(f"plot.py: --smooth {args.smooth}: expected a weight in [0, 1)\n")
        return 2

    def warn(message):
        sys.stderr.write("plot.py: warning: " + message + "\n")

    try:
        runs = read_runs(args.run_dirs, warn)
    except (CorruptFile, FileNotFoundError) as e:
        sys.stderr.write(f"plot.py: {e}\n")
        return 1
    if args.tags:
        keep = {t.strip() for t in args.tags.split(",") if t.strip()}
        runs = {label: {t: p for t, p in tags.items() if t in keep} for label, tags in runs.items()}
        runs = {label: tags for label, tags in runs.items() if tags}
    if args.dump:
        json.dump({label: {t: [[s, v] for s, v in p] for t, p in tags.items()} for label, tags in runs.items()},
                  sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    out = args.output or (None if args.dump else "curves.png")
    if out:
        tags = sorted({t for run_tags in runs.values() for t in run_tags})
        if not tags:
            sys.stderr.write("plot.py: no scalars found under " + " ".join(args.run_dirs) + "\n")
            return 1
        plot(runs, tags, out, args.smooth)
        sys.stderr.write(f"plot.py: wrote {out} ({len(tags)} tags, {len(runs)} runs)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
