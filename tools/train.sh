#!/usr/bin/env bash
# The README's train command: installs what is missing (tools/setup.sh), builds, and trains.
# Extra arguments go to the training program.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/setup.sh
bazel build -c opt //examples/demo:train_mlp
exec bazel-bin/examples/demo/train_mlp "$@"
