"""Compile and link flags of the targets that use libtorch 1.13 (Debian's libtorch-dev) as a peer:
benchmarks (tests/bench) and parity tests (tests/tensor, tests/optim). Never the library itself."""

# The C++ API's headers are a system include (their warnings are not ours).
LIBTORCH_COPTS = [
    "-isystem/usr/include/torch/csrc/api/include",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
]

# The torch headers' CHECK macros come from glog (libgoogle-glog-dev, a dependency of libtorch-dev);
# a target that instantiates them links it.
LIBTORCH_LINKOPTS = ["-lglog"]
