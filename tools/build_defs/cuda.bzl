"""cuda_library: .cu files compiled by nvcc into a cc_library, when a CUDA toolkit was found.

Bazel 4 has no CUDA rules, and the recipe that works offline is: one nvcc action per .cu file that
writes a position-independent object, and a cc_library over those objects. The nvcc step is a small
rule rather than a genrule so that the headers of `deps` (e.g. //tensor:error, which pulls in fmt)
are inputs of the action and their include paths reach nvcc, with no extra bookkeeping per target.

Without a toolkit (CUDA_ENABLED is False) the macro defines nothing. BUILD files cannot use `if`
at top level, so the condition lives in the macros: cuda_library here, chorus_test(cuda = True) in
test.bzl, and @local_cuda//:defs.bzl's if_cuda() for anything else.
"""

load("@local_cuda//:defs.bzl", "CUDA_ARCHS", "CUDA_ENABLED", "CUDA_HOST_OPT", "NVCC")

# The GPUs nvcc compiles for, as compute capabilities without the dot: by default sm_80 (A100) and
# sm_90 (H100/H200) machine code, plus PTX of the newest, which later GPUs can JIT.
# `CHORUS_CUDA_ARCHS=90` in the environment of bazel (a comma-separated list, as PyTorch's
# TORCH_CUDA_ARCH_LIST; read by @local_cuda's rule, third_party/cuda/cuda_configure.bzl) picks others:
# CI (.ci/run, on a machine without a GPU) compiles sm_90 alone, which checks that every kernel
# compiles and links in a third less nvcc time (kernels/cuda/reduce.cu: 65 s for the default, 39 s
# for sm_90 + PTX; 2026-12-01, Zen 3). No kernel's code depends on the architecture (no
# __CUDA_ARCH__ version tests).
def _gencode_flags(archs):
    numbers = [a.strip() for a in archs.split(",") if a.strip()]
    if not numbers:
        fail("CHORUS_CUDA_ARCHS: expected compute capabilities such as 80,90; got '%s'" % archs)
    for n in numbers:
        if not n.isdigit() or len(n) < 2:
            fail("CHORUS_CUDA_ARCHS: '%s' is not a compute capability without its dot (80, 86, 90)" % n)
    flags = ["-gencode=arch=compute_{0},code=sm_{0}".format(n) for n in numbers]
    newest = sorted([int(n) for n in numbers])[-1]
    return flags + ["-gencode=arch=compute_{0},code=compute_{0}".format(newest)]

_GENCODE = _gencode_flags(CUDA_ARCHS) if CUDA_ENABLED else []

# fmt 9 turns its `constexpr` off when it sees __NVCC__, but keeps `consteval` format-string checks
# and C++20 `constexpr` members that call those functions. The result does not compile: nvcc's
# front end rejects the consteval checks and g++ (host pass) rejects the constexpr members. Telling
# fmt that constexpr works (it does, with nvcc 13 in C++20 mode) makes .cu files see fmt as g++ does.
_FMT_WORKAROUND = ["-DFMT_USE_CONSTEXPR=1"]

def _nvcc_objects_impl(ctx):
    cc_infos = [dep[CcInfo] for dep in ctx.attr.deps if CcInfo in dep]
    compilation = cc_common.merge_cc_infos(cc_infos = cc_infos).compilation_context

    # The workspace root and its generated-file twins, as cc_library would give a .cc file.
    include_flags = ["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path]
    include_flags += ["-I" + d for d in compilation.quote_includes.to_list()]
    include_flags += ["-I" + d for d in compilation.includes.to_list()]
    for d in compilation.system_includes.to_list():
        include_flags += ["-isystem", d]
    define_flags = ["-D" + d for d in compilation.defines.to_list()]
    headers = depset(ctx.files.hdrs, transitive = [compilation.headers])

    objects = []
    for src in ctx.files.srcs:
        # Named after the source's path in the package (no clash between a/x.cu and b/x.cu).
        # `.pic.o`: cc_library then uses the object for both its static archive and its shared
        # library (tests link shared), and knows it is position independent.
        stem = src.short_path[len(ctx.label.package) + 1:] if ctx.label.package else src.short_path
        obj = ctx.actions.declare_file(
            "_objs/{}/{}.pic.o".format(ctx.label.name, stem[:-len(".cu")]),
        )
        args = ctx.actions.args()
        # -O: the host code's optimization only (CUDA_HOST_OPT, 3 unless CHORUS_CUDA_HOST_OPT says
        # otherwise: .ci/run on a machine without a GPU compiles it at 0, third_party/cuda/cuda_configure.bzl).
        args.add_all(["-std=c++20", "-O" + CUDA_HOST_OPT, "-Xcompiler", "-fPIC"] + _GENCODE + _FMT_WORKAROUND)

        # The same warnings as .bazelrc gives g++; -lineinfo maps SASS to source lines for Nsight
        # Compute and compute-sanitizer at no run-time cost.
        args.add_all(["-Xcompiler", "-Wall,-Wextra", "-lineinfo"])
        args.add_all(include_flags + define_flags + ctx.attr.copts)
        args.add_all(["-c", src.path, "-o", obj.path])
        ctx.actions.run(
            executable = NVCC,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "Compiling CUDA %s" % src.short_path,
            # nvcc finds the host compiler (g++) on PATH.
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library whose .cu `srcs` are compiled by nvcc; nothing at all without CUDA.

    Args:
      name: the cc_library's name.
      srcs: .cu files, each compiled by nvcc into one object (C++20, host code at -O3 or
        $CHORUS_CUDA_HOST_OPT, sm_80/sm_90 + PTX or $CHORUS_CUDA_ARCHS);
        other files (.cpp wrappers over cuBLAS, cuDNN, NCCL) go to the cc_library and gcc.
      hdrs: headers of this library; also inputs of every nvcc action.
      deps: cc_library targets whose headers the sources include and whose code they call;
        @local_cuda//:cudart is always added.
      copts: extra nvcc flags (e.g. ["--use_fast_math"]).
      visibility: as for cc_library.
      **kwargs: passed to the cc_library (e.g. testonly, tags).
    """
    if not CUDA_ENABLED:
        return
    cu_srcs = [s for s in srcs if s.endswith(".cu")]
    other_srcs = [s for s in srcs if not s.endswith(".cu")]
    objects = []
    if cu_srcs:
        _nvcc_objects(
            name = name + "_nvcc",
            srcs = cu_srcs,
            hdrs = hdrs,
            deps = deps,
            copts = copts,
            testonly = kwargs.get("testonly", False),
            visibility = ["//visibility:private"],
        )
        objects = [":" + name + "_nvcc"]
    native.cc_library(
        name = name,
        srcs = objects + other_srcs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        visibility = visibility,
        **kwargs
    )
