"""chorus's external repositories, for chorus's own WORKSPACE and for a workspace that uses chorus.

Bazel 4's WORKSPACE has no transitive dependencies, so a project that depends on chorus declares
chorus's repositories too, by calling this macro after declaring @chorus (docs/build.md, "Using
chorus from another project"):

    local_repository(name = "chorus", path = "/path/to/chorus")
    load("@chorus//tools/build_defs:workspace.bzl", "chorus_dependencies")
    chorus_dependencies(chorus_path = "/path/to/chorus")

Every repository is a folder on this machine (Debian packages that tools/setup.sh installs) or
generated from one; nothing is downloaded. The BUILD files come from chorus's third_party/ through
Label(), which resolves in the repository that loaded this file.
"""

load("//third_party/cuda:cuda_configure.bzl", "cuda_configure")

def chorus_dependencies(chorus_path = ""):
    """Declares chorus's external repositories.

    Args:
      chorus_path: chorus's folder, as given to local_repository; empty in chorus's own WORKSPACE,
        where the folders under third_party/ are relative to the workspace itself.
    """
    root = chorus_path + "/" if chorus_path else ""

    # Shims for the three repositories Bazel 4 itself wants to download. @rules_cc: Debian's
    # bazel-rules-cc copied and patched for Bazel 4.2.3 by tools/setup.sh (gitignored).
    native.local_repository(name = "rules_cc", path = root + "third_party/rules_cc")

    # @rules_java: needed by the JDK toolchain registration even in a C++-only build; Debian's works as is.
    native.local_repository(name = "rules_java", path = "/usr/share/bazel/rules/java")

    # @remote_coverage_tools: an implicit dependency of every cc_test; ours holds no-op coverage tools.
    native.local_repository(name = "remote_coverage_tools", path = root + "third_party/remote_coverage_tools")

    # System libraries (Debian packages). Header-only libraries that live directly in /usr/include
    # are already on the compiler's default search path, so their BUILD files only declare the
    # headers (for rebuild tracking) and add no -I: adding /usr/include as -isystem would break
    # libstdc++'s #include_next.
    for name, path in [
        ("eigen", "/usr/include/eigen3"),
        ("catch2", "/usr/include/catch2"),
        ("fmt", "/usr/include/fmt"),
        ("nlohmann_json", "/usr/include/nlohmann"),
        ("cli11", "/usr/include/CLI"),
        ("zlib", "/usr/include"),
        # Gloo: headers in /usr/include/gloo, library in /usr/lib (Debian libgloo-dev 0.5.0).
        ("gloo", "/usr"),
        # oneDNN (Debian libdnnl-dev 2.6.3): CPU convolutions (kernels/cpu/onednn_conv.cpp).
        ("onednn", "/usr"),
        # OpenBLAS, the OpenMP build (benchmarks only: the CPU peer for our GEMM), from its own
        # folder so binaries get it even where Debian's alternatives point libopenblas.so.0 at the
        # pthread build.
        ("openblas", "/usr/lib/x86_64-linux-gnu/openblas-openmp"),
        # libtorch (Debian libtorch-dev 1.13): benchmarks only, as the peer chorus is measured against.
        ("libtorch", "/usr"),
    ]:
        native.new_local_repository(name = name, path = path, build_file = str(Label("//third_party:%s.BUILD" % name)))

    # CUDA: detected, not required. Generates @local_cuda from $CUDA_HOME or /usr/local/cuda. Without
    # a toolkit it still exists, with CUDA_ENABLED = False in @local_cuda//:defs.bzl, so CPU-only
    # machines build everything else unchanged.
    cuda_configure(name = "local_cuda")
