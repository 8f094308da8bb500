#!/usr/bin/env bash
# Builds everything that needs a GPU to run — every gpu-tagged test and every GPU benchmark — and
# gathers it into one folder (default .gpu_bundle/, ignored by git) that a GPU machine without Bazel
# can run: the binaries (stripped), the non-CUDA shared libraries they load, the PyTorch peer scripts
# (tools/gpu/peer.py, tools/torch_peer.py for gpu_bench), compare_bench.py, and run.sh. The CUDA libraries are not bundled (cuBLASLt alone is ~500 MB): run.sh takes them from
# the PyTorch wheels on that machine (nvidia/*/lib). See docs/gpu.md.
#   tools/gpu_bundle.sh [OUT_DIR]          then, on the GPU machine:  OUT_DIR/run.sh [LOG_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-.gpu_bundle}"
limit_bytes=$((64 * 1024 * 1024))

bash tools/setup.sh >/dev/null
# What runs on the GPU machine gets its host code optimized: a CHORUS_CUDA_HOST_OPT left in this
# shell (.ci/run's 0 for machines without a GPU) would slow every kernel launch's host side.
if [[ -n "${CHORUS_CUDA_HOST_OPT:-}" && "${CHORUS_CUDA_HOST_OPT}" != 3 ]]; then
  echo "gpu_bundle.sh: ignoring CHORUS_CUDA_HOST_OPT=${CHORUS_CUDA_HOST_OPT} (the bundle's .cu host code is compiled at -O3)" >&2
fi
unset CHORUS_CUDA_HOST_OPT
if ! bazel query '@local_cuda//:cudart' >/dev/null 2>&1; then
  echo "gpu_bundle.sh: no CUDA toolkit found (/usr/local/cuda or \$CUDA_HOME): nothing to bundle" >&2
  exit 1
fi
mapfile -t targets < <(bazel query 'attr(tags, "\bgpu\b", tests(//...)) union attr(tags, "\bgpu_bench\b", //...)' 2>/dev/null)
if ((${#targets[@]} == 0)); then
  echo "gpu_bundle.sh: no gpu-tagged targets" >&2
  exit 1
fi
# Helper programs the gpu tests start (not tests themselves): libexec/. The examples run.sh trains
# on the GPU for a few steps (--device cuda): examples/, with BERT's vocabulary in data/.
helpers=(//tests/distributed:dist_worker //tests/pipeline:pipeline_worker)
examples=(//examples/resnet:resnet //examples/bert:bert)
bazel build -c opt "${targets[@]}" "${helpers[@]}" "${examples[@]}"

rm -rf "$out"
mkdir -p "$out/lib" "$out/data/bert"
# Copies each label's binary into $out/<folder>, stripped of debug information.
place() {  # folder label...
  local folder="$1" label path
  shift
  mkdir -p "$out/$folder"
  for label in "$@"; do
    path="bazel-bin/${label#//}"
    path="${path/://}"
    cp -L "$path" "$out/$folder/$(basename "$path")"
    chmod u+w "$out/$folder/$(basename "$path")"
    strip --strip-debug "$out/$folder/$(basename "$path")"
  done
}
place bin "${targets[@]}"
place libexec "${helpers[@]}"
place examples "${examples[@]}"
cp "${CHORUS_DATA_DIR:-$HOME/.cache/chorus/data}/bert/vocab.txt" "$out/data/bert/vocab.txt"

# Shared libraries the binaries load — chorus's own (Bazel links each library as a .so found through
# an RPATH into bazel-bin/_solib_k8, which the copies lose) and the system's — except the C runtime
# (the GPU machine has its own glibc) and the CUDA libraries (taken from the PyTorch wheels there).
# ldd runs on the binaries in bazel-bin, where their RPATH still resolves.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libmvec\.|libdl\.|libpthread\.|librt\.|libcuda\.|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink)'
for label in "${targets[@]}" "${helpers[@]}" "${examples[@]}"; do
  path="bazel-bin/${label#//}"
  path="${path/://}"
  ldd "$path" | awk '/=> \// {print $1, $3}' | while read -r soname file; do
    [[ "$soname" =~ $skip ]] && continue
    [[ -e "$out/lib/$soname" ]] || cp -L "$file" "$out/lib/$soname"
  done
  if ldd "$path" | grep -q 'not found'; then
    echo "gpu_bundle.sh: $label: libraries not found: $(ldd "$path" | awk '/not found/ {print $1}' | tr '\n' ' ')" >&2
    exit 1
  fi
done
chmod -R u+w "$out/lib"
strip --strip-debug "$out"/lib/lib*_S*.so 2>/dev/null || true

# The binaries and libraries travel xz-compressed (oneDNN alone is 40 MB); run.sh unpacks them.
# The statically linked programs (examples/, libexec/, the benchmarks: ~65 MB each) each hold the
# same ~55 MB of CUDA kernels; a dictionary that spans three of them lets xz store those once (at
# 9fe0e2c: 526 MB unpacked, 63.8 MiB with xz -6's 8 MiB dictionary, 24.0 MiB with this one; about
# 5 minutes on one Zen 3 core, 3 s to unpack, 192 MiB of memory to unpack).
tar -C "$out" -cf - bin lib libexec examples data | xz -T1 --lzma2=preset=6,dict=192MiB >"$out/payload.tar.xz"
rm -rf "$out/bin" "$out/lib" "$out/libexec" "$out/examples" "$out/data"
cp tools/gpu/peer.py "$out/peer.py"
cp tools/torch_peer.py "$out/torch_peer.py"
cp tools/gpu/compare_bench.py "$out/compare_bench.py"
cp tools/gpu/run.sh "$out/run.sh"
chmod +x "$out/run.sh"
# The device tool's 64 MiB covers the carried folder and the working tree it travels with.
size=$(du -sb "$out" | cut -f1)
# (A tracked file deleted in the working tree makes du exit 1: its total still counts the rest. An
# OUT_DIR inside the tree that git does not ignore is counted twice: on the safe side.)
tree=$( (git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null || true) | tail -1 | cut -f1)
if ((size + tree > limit_bytes)); then
  echo "gpu_bundle.sh: $out is $((size / 1048576)) MiB and the working tree $((tree / 1048576)) MiB, over the 64 MiB carry limit" >&2
  exit 1
fi
echo "gpu_bundle.sh: $out ($((size / 1048576)) MiB, with the working tree $(((size + tree) / 1048576)) MiB of 64): ${#targets[@]} target(s): ${targets[*]}"
