"""chorus_test: a Catch2 cc_test.

Every test links //tests:catch_main, which compiles Catch2's main() once (that one translation
unit takes 12-29 s on two cores, so each test file must not compile its own).
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED")

def chorus_test(name, srcs, deps = [], tags = [], size = "small", cuda = False, **kwargs):
    """cc_test over the Catch2 TEST_CASEs in `srcs`.

    Args:
      name, srcs, deps, size: as for cc_test.
      tags: tag tests that need a GPU to run with "gpu"; tools/test.sh skips them on machines
        without one. A "gpu" test is also a `cuda` test. tools/test.sh reads three more (its
        header says how each phase picks): "no_asan", "asan_only" and "also_opt".
      cuda: the test links CUDA code. Without a CUDA toolkit the test is not defined at all (BUILD
        files cannot use `if`, so the condition lives here), and `bazel build //...` still works.
        Such a test (and a "gpu" one) gets the tag "cuda": the sanitizer builds of
        `tools/test.sh --full` have no CUDA, so its -c opt phase runs them.
      **kwargs: passed to cc_test.
    """
    if cuda or "gpu" in tags:
        if not CUDA_ENABLED:
            return
        tags = tags + ["cuda"]
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + ["//tests:catch_main", "@catch2//:catch2"],
        tags = tags,
        size = size,
        **kwargs
    )
