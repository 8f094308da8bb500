"""Compile and link flags of the targets that use libtorch 1.13 (Debian's libtorch-dev) as a peer:
benchmarks (tests/bench) and parity tests (tests/tensor, tests/optim). Never the library itself."""

# The C++ API's headers are a system include (their warnings are not ours). In the clang builds
# (the sanitizer configs of .bazelrc set --define=chorus_cc=clang) these files compile as C++17:
# clang (14, and 19 too) cannot compile libtorch 1.13's headers in C++20 against libstdc++ 12
# (std::vector<c10::IValue>'s constexpr members instantiated while IValue is incomplete), and in
# C++17 it does. chorus's headers compile either way (the C++20 forms they use are extensions clang
# takes in C++17, hence the two -Wno); libstdc++'s types are the same in both.
LIBTORCH_COPTS = [
    "-isystem/usr/include/torch/csrc/api/include",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
] + select({
    "//tools/build_defs:clang": ["-std=c++17", "-Wno-c++20-extensions", "-Wno-c++20-designator"],
    "//conditions:default": [],
})

# The torch headers' CHECK macros come from glog (libgoogle-glog-dev, a dependency of libtorch-dev);
# a target that instantiates them links it.
LIBTORCH_LINKOPTS = ["-lglog"]
