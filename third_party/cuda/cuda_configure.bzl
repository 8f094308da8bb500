"""cuda_configure: generates @local_cuda from the CUDA toolkit on this machine, if there is one.

Why a repository rule: whether CUDA exists is a fact about the machine, and BUILD files need it at
load time (to emit CUDA targets or not). The rule writes @local_cuda//:defs.bzl with CUDA_ENABLED,
so `bazel build //...` works both on a CPU-only box (CUDA targets vanish) and with a toolkit.

Where it looks: $CUDA_HOME if set (and only there, so CUDA_HOME=/nonexistent turns CUDA off), else
/usr/local/cuda. A toolkit counts when <root>/bin/nvcc exists. Libraries are looked up by SONAME
(libcudart.so.13, libcudnn.so.9, ...) in the toolkit's lib folders first, then the system's, since
cuDNN and NCCL are often installed apart from the toolkit.

CHORUS_CUDA_ARCHS (e.g. "86,90"; default "80,90") names the GPUs nvcc compiles for, as compute
capabilities without the dot; defs.bzl carries it as CUDA_ARCHS (tools/build_defs/cuda.bzl). Read
here, from the environment of every bazel command, so no script can build with one value and then
with another by forgetting a flag: changing it re-runs this rule and recompiles the kernels.

CHORUS_CUDA_HOST_OPT (0-3; default 3) is nvcc's -O: the optimization of the HOST code of the .cu
files (kernel launch stubs, dtype dispatch, launch plans), never of the kernels themselves (nvcc
optimizes device code at any -O: the .nv_fatbin section of every object is byte-identical at -O0
and -O3). On a machine where the CUDA code can never run (no GPU), nothing of that host code runs
either, and .ci/run sets 0: the host pass was the largest part of nvcc's time (docs/build.md).
Carried as CUDA_HOST_OPT; read here for the same reason as CHORUS_CUDA_ARCHS.

After installing or removing a toolkit: `bazel sync --configure` (or `bazel clean --expunge`).
"""

# Library short name -> file name prefix. The version is found on disk (see _find_lib), not assumed.
_LIBS = {
    "cudart": "libcudart.so.",
    "cublas": "libcublas.so.",
    "cublasLt": "libcublasLt.so.",
    "cudnn": "libcudnn.so.",
    "nccl": "libnccl.so.",
}

def _lib_dirs(root):
    return [
        root + "/lib64",
        root + "/lib",
        root + "/targets/x86_64-linux/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ]

def _find_lib(rctx, root, prefix):
    """Returns the path of `<prefix><N>` (one numeric version part: the SONAME form) or None.

    The first folder that has one wins; within it the highest N (two toolkits' libs side by side).
    """
    for d in _lib_dirs(root):
        dir_path = rctx.path(d)
        if not dir_path.exists:
            continue
        best = None
        for entry in dir_path.readdir():
            version = entry.basename[len(prefix):]
            if entry.basename.startswith(prefix) and version.isdigit():
                if best == None or int(version) > best[0]:
                    best = (int(version), entry)
        if best:
            return best[1]
    return None

def _cuda_configure_impl(rctx):
    cuda_home = rctx.os.environ.get("CUDA_HOME", "")
    archs = rctx.os.environ.get("CHORUS_CUDA_ARCHS", "") or "80,90"
    host_opt = rctx.os.environ.get("CHORUS_CUDA_HOST_OPT", "") or "3"
    if host_opt not in ["0", "1", "2", "3"]:
        fail("CHORUS_CUDA_HOST_OPT: expected 0, 1, 2 or 3 (nvcc's -O for the host code of .cu files); got '%s'" % host_opt)
    root = cuda_home if cuda_home else "/usr/local/cuda"
    nvcc = rctx.path(root + "/bin/nvcc")

    libs = {}
    if nvcc.exists:
        for name, prefix in _LIBS.items():
            found = _find_lib(rctx, root, prefix)
            if found:
                libs[name] = found
    enabled = nvcc.exists and ("cudart" in libs)
    if nvcc.exists and not enabled:
        print("cuda_configure: {} has nvcc but no libcudart.so.N; building without CUDA".format(root))

    if enabled and "cublas" not in libs:
        fail("cuda_configure: {} has nvcc and libcudart but no libcublas.so.N in {}; chorus's CUDA backend ".format(root, ", ".join(_lib_dirs(root))) +
             "needs cuBLAS (it opens it at the first CUDA matmul): install the toolkit's cuBLAS, or set CUDA_HOME " +
             "to a toolkit that has it, then `bazel sync --configure`")
    if not enabled:
        rctx.file("BUILD", "# No CUDA toolkit found at {} (see cuda_configure.bzl).\n".format(root))
        rctx.file("defs.bzl", _defs(False, "", "", [], archs, host_opt))
        return

    # Bazel can only name files inside a repository: the headers come in through a symlink.
    rctx.symlink(root + "/include", "include")
    targets = [
        _LIB_TARGET.format(name = name, path = str(path), dir = str(path.dirname))
        for name, path in libs.items()
    ]
    rctx.file("lib_paths.h", _lib_paths_header(root, libs))
    rctx.template("BUILD", Label("//third_party/cuda:BUILD.local_cuda.tpl"), {
        "%{root}": root,
        "%{libs}": "\n".join(targets),
    })
    rctx.file("defs.bzl", _defs(True, root, root + "/bin/nvcc", sorted(libs.keys()), archs, host_opt))

# Per library: link the versioned file (its SONAME) by absolute path and add its folder as rpath,
# so the loader opens it from its real folder. Not cc_import, on purpose: cc_import makes binaries
# load the library through a symlink in Bazel's _solib folder, and then the library's own
# RUNPATH $ORIGIN (which glibc does not resolve through symlinks) names that _solib folder. libcublas
# then cannot find libcublasLt, nor libcudnn its libcudnn_ops.so.9 & co. (dlopen()ed at run time),
# unless ld.so.conf or LD_LIBRARY_PATH happens to list the real folder. An rpath on the binary does
# not help there: glibc ignores it for objects that have their own RUNPATH.
_LIB_TARGET = """cc_library(
    name = "{name}",
    linkopts = ["{path}", "-Wl,-rpath,{dir}"],
    deps = [":headers"],
)
"""

def _lib_paths_header(root, libs):
    """lib_paths.h: each library found, by full path, for the ones chorus opens at first use (dlopen).

    cuBLAS is not linked (kernels/cuda/cublas_api.cpp says why): it is opened when a CUDA matmul first
    runs, by SONAME first and then by the path found here.
    """
    lines = [
        "// Generated by //third_party/cuda:cuda_configure.bzl from the toolkit at {}. Do not edit.".format(root),
        "// The CUDA libraries found when chorus was configured, by SONAME and by full path.",
        "#pragma once",
        "",
        "namespace chorus::cuda::lib_paths {",
        "",
    ]
    for name in sorted(libs.keys()):
        path = libs[name]
        ident = "k" + name[0].upper() + name[1:]
        lines.append('inline constexpr const char {}Soname[] = "{}";'.format(ident, path.basename))
        lines.append('inline constexpr const char {}Path[] = "{}";'.format(ident, str(path)))
    lines += ["", "}  // namespace chorus::cuda::lib_paths", ""]
    return "\n".join(lines)

def _defs(enabled, root, nvcc, libs, archs, host_opt):
    return '''"""Generated by //third_party/cuda:cuda_configure.bzl. Do not edit."""

# True when a CUDA toolkit (nvcc + libcudart) was found. BUILD files cannot branch on it (no
# top-level `if`); use cuda_library, chorus_test(cuda = True) or if_cuda() instead.
CUDA_ENABLED = {enabled}

# The toolkit's root and its nvcc; empty strings without CUDA.
CUDA_ROOT = "{root}"
NVCC = "{nvcc}"

# Short names of the libraries found, each a target @local_cuda//:<name> (e.g. "cudnn", "nccl").
CUDA_LIBS = {libs}

# The GPUs nvcc compiles for ($CHORUS_CUDA_ARCHS, default "80,90"; tools/build_defs/cuda.bzl).
CUDA_ARCHS = "{archs}"

# nvcc's -O for the host code of .cu files ($CHORUS_CUDA_HOST_OPT, default 3); device code is
# optimized at any value.
CUDA_HOST_OPT = "{host_opt}"

def if_cuda(if_true, if_false = []):
    """`if_true` when CUDA is enabled, else `if_false` (e.g. srcs = if_cuda(["x.cu"]))."""
    return if_true if CUDA_ENABLED else if_false
'''.format(enabled = enabled, root = root, nvcc = nvcc, libs = libs, archs = archs, host_opt = host_opt)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME", "CHORUS_CUDA_ARCHS", "CHORUS_CUDA_HOST_OPT"],
    # `bazel sync --configure` re-runs it, e.g. after a toolkit was installed.
    configure = True,
    local = True,
)
