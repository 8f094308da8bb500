#!/usr/bin/env bash
# Installs chorus for programs built outside Bazel, CMake's way:
#   PREFIX/lib/libchorus.so                          the library (tools/install:libchorus.so: tensors,
#                                                    autograd, nn, optim, data, distributed, utils,
#                                                    the example models; CUDA kernels when the
#                                                    toolkit is present, as in chorus's own build)
#   PREFIX/include/chorus/...                        the headers, as the source tree lays them out
#                                                    (#include "tensor/tensor.h", "nn/nn.h", ...)
#   PREFIX/lib/cmake/chorus/chorusConfig.cmake       find_package(chorus) -> target chorus::chorus
#   PREFIX/lib/cmake/chorus/chorusConfigVersion.cmake
# The library links Debian's libfmt, libdnnl, libopenblas, libgloo and zlib (tools/setup.sh installs them); a
# program using it needs those and a C++20 compiler (the target asks CMake for cxx_std_20).
#
#   bash tools/install.sh PREFIX            e.g. bash tools/install.sh /usr/local
# CHORUS_CUDA_ARCHS (e.g. 86,90): the GPUs the CUDA kernels are compiled for (default sm_80 and
# sm_90, third_party/cuda/cuda_configure.bzl); CI sets it for every bazel command it runs.
set -euo pipefail
prefix="${1:?usage: bash tools/install.sh PREFIX}"
mkdir -p "$prefix/lib/cmake/chorus" "$prefix/include/chorus"
prefix="$(cd "$prefix" && pwd)"  # absolute, before leaving the caller's folder
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="0.1.0"
cd "$repo"
bazel build -c opt --disk_cache="${CHORUS_CACHE_DIR:-$HOME/.cache/chorus}/bazel-disk" //tools/install:libchorus
install -m 0755 "$(bazel info -c opt bazel-bin 2>/dev/null)/tools/install/libchorus.so" "$prefix/lib/libchorus.so"
# The library's headers: every .h of the library's folders (not tests, tools, third_party or the
# example programs; not kernels/cuda, which only CUDA sources include).
rm -rf "$prefix/include/chorus"
while IFS= read -r header; do
  install -D -m 0644 "$header" "$prefix/include/chorus/$header"
done < <(find autograd data distributed kernels nn optim tensor utils examples/models -name '*.h' -not -path 'kernels/cuda/*' | sort)
cat >"$prefix/lib/cmake/chorus/chorusConfig.cmake" <<'CMAKE'
# chorus, installed by tools/install.sh: find_package(chorus) defines the imported target
# chorus::chorus (the library, its headers, C++20, and the libraries its headers call into).
include(CMakeFindDependencyMacro)
find_dependency(fmt)
get_filename_component(_chorus_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET chorus::chorus)
  add_library(chorus::chorus SHARED IMPORTED)
  set_target_properties(chorus::chorus PROPERTIES
    IMPORTED_LOCATION "${_chorus_prefix}/lib/libchorus.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_chorus_prefix}/include/chorus"
    INTERFACE_COMPILE_FEATURES cxx_std_20
    INTERFACE_LINK_LIBRARIES fmt::fmt)
endif()
unset(_chorus_prefix)
CMAKE
cat >"$prefix/lib/cmake/chorus/chorusConfigVersion.cmake" <<CMAKE
# chorus $version: compatible with a request for the same major version and an older or equal minor.
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION_MAJOR STREQUAL "${version%%.*}" AND NOT PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
else()
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
endif()
CMAKE
echo "tools/install.sh: chorus $version in $prefix ($(find "$prefix/include/chorus" -name '*.h' | wc -l) headers)"
