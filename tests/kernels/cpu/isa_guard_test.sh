#!/usr/bin/env bash
# Runs isa_guard.py ([ISA variants], kernels/cpu/capability.h) over a statically linked chorus
# program: every AVX-512 instruction must sit in an isa_avx512 function.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
exec python3 "$root/tests/kernels/cpu/isa_guard.py" "$root/tests/kernels/cpu/isa_guard_program"
