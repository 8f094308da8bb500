#!/usr/bin/env python3
"""The histogram PyTorch's SummaryWriter.add_histogram logs, computed with numpy: the oracle the
C++ make_histogram is checked against (tests/utils/summary_writer_test.cpp).

    echo '{"values": [...], "bins": "tensorflow" | [edges...]}' | python3 numpy_histogram.py

Prints {"min", "max", "num", "sum", "sum_squares", "bucket_limit", "bucket"} as JSON. The steps are
those of torch/utils/tensorboard (writer.py's default_bins for bins="tensorflow", summary.py's
make_histogram without max_bins): numpy.histogram over the edges, then the buckets from the first
to the last non-empty one, with the bucket before them (or a zero bucket at the left edge).
"""

import json
import sys

try:
    import numpy as np
except ImportError as e:
    sys.stderr.write(f"numpy_histogram.py: numpy is missing ({e}): run tools/setup.sh (python3-numpy)\n")
    sys.exit(3)


def tensorflow_bins():
    edge = 1e-12
    positive = []
    while edge < 1e20:
        positive.append(edge)
        edge *= 1.1
    return [-e for e in reversed(positive)] + [0.0] + positive


def pytorch_histogram(values, bins):
    values = np.asarray(values, dtype=float).reshape(-1)
    counts, edges = np.histogram(values, bins=np.asarray(bins, dtype=float))
    nonzero_so_far = np.cumsum(counts > 0)
    first = int(np.searchsorted(nonzero_so_far, 0, side="right"))  # first non-empty bucket
    last_plus_one = int(np.searchsorted(nonzero_so_far, nonzero_so_far[-1] - 1, side="right")) + 1
    if first > 0:
        kept = counts[first - 1:last_plus_one]
    else:
        kept = np.concatenate([[0], counts[:last_plus_one]])
    limits = edges[first:last_plus_one + 1]
    return {
        "min": float(values.min()),
        "max": float(values.max()),
        "num": float(len(values)),
        "sum": float(values.sum()),
        "sum_squares": float(values.dot(values)),
        "bucket_limit": [float(x) for x in limits],
        "bucket": [float(x) for x in kept],
    }


def main():
    request = json.load(sys.stdin)
    bins = request.get("bins", "tensorflow")
    if bins == "tensorflow":
        bins = tensorflow_bins()
    json.dump(pytorch_histogram(request["values"], bins), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
