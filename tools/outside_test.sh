#!/usr/bin/env bash
# Builds and runs a small program outside the repository that uses chorus (tools/outside/hello.cpp),
# both ways docs/build.md documents (issue 34 item 5):
#   1. Bazel: a fresh workspace that declares @chorus with local_repository, calls
#      chorus_dependencies() and imports tools/build_defs/outside.bazelrc;
#   2. CMake: tools/install.sh into a prefix, then find_package(chorus) from tools/outside/CMakeLists.txt.
# Prints "outside_test: PASSED bazel" and "outside_test: PASSED cmake" as each way builds and runs
# (tools/test.sh --full counts them as two tests); exits non-zero if either fails.
#
#   bash tools/outside_test.sh [WORK_DIR]     (default ~/.cache/chorus/outside; the Bazel output base
#                                             and install prefix live there, so a rerun is incremental)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${1:-$HOME/.cache/chorus/outside}"
disk_cache="${CHORUS_CACHE_DIR:-$HOME/.cache/chorus}/bazel-disk"
mkdir -p "$work"
log() { echo "=== outside_test: $*"; }

# --- 1. Bazel ------------------------------------------------------------------------------------
ws="$work/bazel_workspace"
rm -rf "$ws"
mkdir -p "$ws"
cp "$repo/tools/outside/hello.cpp" "$ws/hello.cpp"
cp "$repo/tools/outside/hello.BUILD" "$ws/BUILD"
cat >"$ws/WORKSPACE" <<WS
workspace(name = "hello_chorus")

local_repository(
    name = "chorus",
    path = "$repo",
)

load("@chorus//tools/build_defs:workspace.bzl", "chorus_dependencies")

chorus_dependencies(chorus_path = "$repo")
WS
echo "import $repo/tools/build_defs/outside.bazelrc" >"$ws/.bazelrc"
log "bazel: building //:hello in $ws (chorus as @chorus, CPU only)"
# The workspace's Bazel server goes when this script ends, whether it passed or not.
trap '(cd "$ws" && bazel --output_base="$work/bazel_output_base" shutdown) >/dev/null 2>&1 || true' EXIT
start=$SECONDS
# CUDA_HOME=/nonexistent: the CPU build (a workspace on a CUDA machine gets chorus's CUDA kernels as
# chorus's own workspace does; this check does not need them). -c fastbuild, Bazel's default (what
# a plain `bazel build //:hello` gives): @chorus's files have action keys of their own here (their
# paths are external/chorus/...), so nothing of the main build is reused, and cold this build took
# 154 s against 209 s in -c opt (2026-11-30, 2 cores); what it checks (the BUILD files, include
# paths and flags seen from another workspace) does not depend on the mode.
(cd "$ws" && bazel --output_base="$work/bazel_output_base" build -c fastbuild --disk_cache="$disk_cache" \
  --repo_env=CUDA_HOME=/nonexistent //:hello)
log "bazel: built in $((SECONDS - start)) s; running"
"$ws/bazel-bin/hello"
echo "outside_test: PASSED bazel"

# --- 2. CMake --------------------------------------------------------------------------------------
prefix="$work/prefix"
log "cmake: tools/install.sh $prefix"
bash "$repo/tools/install.sh" "$prefix"
rm -rf "$work/cmake_build"
cmake -S "$repo/tools/outside" -B "$work/cmake_build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
cmake --build "$work/cmake_build" -j 2
log "cmake: built; running"
"$work/cmake_build/hello"
echo "outside_test: PASSED cmake"
log "both ways built and ran"
