#!/usr/bin/env bash
# The README's train command: installs what is missing (tools/setup.sh), builds, and trains the
# MNIST CNN with 2-process data parallelism (DDP over Gloo) on CPU, launched by chorusrun.
# Extra arguments go to the training program (e.g. --epochs 1, --dataset fashion-mnist, --model mlp).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/setup.sh
bazel build -c opt //examples/mnist //distributed/launcher:chorusrun
exec bazel-bin/distributed/launcher/chorusrun --nproc-per-node 2 bazel-bin/examples/mnist/mnist "$@"
