"""chorus_fuzz_target: one libFuzzer target and the regression test that replays its corpus.

For a target `x` (sources defining LLVMFuzzerTestOneInput):
  x_fuzz         the libFuzzer binary. Tagged manual: it links only in the clang build
                 (`--config=fuzz`, tools/fuzz.sh), where -fsanitize=fuzzer provides main().
  x_corpus_test  a test in the normal suite (GCC, and under --config=asan): runs every input of
                 corpus/x/ through the same function with a plain main() (replay_main.cpp), so
                 the seeds and every input that ever found a bug keep being checked.
"""

def chorus_fuzz_target(name, srcs, deps = []):
    native.cc_library(
        name = name + "_lib",
        testonly = True,
        srcs = srcs,
        deps = deps + [":fuzz_util"],
        alwayslink = True,
    )
    native.cc_binary(
        name = name + "_fuzz",
        testonly = True,
        deps = [":" + name + "_lib"],
        tags = ["manual"],
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        deps = [":" + name + "_lib", ":replay_main"],
        data = native.glob(["corpus/" + name + "/**"]),
        args = ["tests/fuzz/corpus/" + name],
    )
