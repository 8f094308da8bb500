"""whole_shared_library: one shared object holding every object file of its deps' libraries.

A cc_binary(linkshared = True) links its deps' archives lazily, so a library nobody in the binary
calls (all of chorus, seen from an empty .so) contributes nothing. This rule links each of the deps'
own libraries with --whole-archive instead, and the libraries they import as shared objects (Gloo,
oneDNN, CUDA's) and their link flags as they are, with the host's g++ (the toolchain Bazel's
auto-configuration found). tools/install.sh installs the result for programs built outside Bazel.
"""

def _whole_shared_library_impl(ctx):
    archives, shared, flags = [], [], []
    for dep in ctx.attr.deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            for flag in linker_input.user_link_flags:
                if flag not in flags:
                    flags.append(flag)
            for lib in linker_input.libraries:
                archive = lib.pic_static_library or lib.static_library
                if archive:
                    if archive not in archives:
                        archives.append(archive)
                elif lib.dynamic_library and lib.dynamic_library not in shared:
                    shared.append(lib.dynamic_library)
    out = ctx.actions.declare_file(ctx.attr.library_name)
    args = ctx.actions.args()
    args.add("-shared")
    args.add("-o", out)
    args.add("-Wl,-soname," + ctx.attr.library_name)
    args.add("-Wl,--whole-archive")
    args.add_all(archives)
    args.add("-Wl,--no-whole-archive")
    args.add_all(shared)
    args.add_all(flags)
    args.add_all(["-lstdc++", "-lm"])
    ctx.actions.run(
        executable = "/usr/bin/g++",
        arguments = [args],
        inputs = depset(archives + shared),
        outputs = [out],
        mnemonic = "WholeSharedLibrary",
        progress_message = "Linking %s from %d libraries" % (ctx.attr.library_name, len(archives)),
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset([out]))]

whole_shared_library = rule(
    implementation = _whole_shared_library_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "library_name": attr.string(mandatory = True),
    },
)
