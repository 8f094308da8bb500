#!/usr/bin/env python3
"""[ISA variants] guard (kernels/cpu/capability.h): in a statically linked chorus binary, AVX-512
instructions may appear only in functions of an `isa_avx512` namespace, which run only after the
CPU was found to have AVX-512. An AVX-512 instruction anywhere else (a shared inline or template
function that a file compiled for AVX-512 emitted and the linker kept for everyone) would be an
illegal instruction on an AVX2-only machine. Usage: isa_guard.py BINARY [BINARY ...]"""
import re
import subprocess
import sys

# Operands and mnemonics only AVX-512 (EVEX) has: 512-bit registers, mask registers, embedded
# broadcasts, the upper 16 vector registers, and instructions without a VEX form.
EVEX = re.compile(
    r"%zmm|%k[0-7]\b|\{1to\d+\}|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|"
    r"\b(vpternlog|vperm[it]2|vpmovm2|vpmov[dqw]2m|vprol|vpror|vplzcnt|vpcompress|vpexpand|vfixupimm|"
    r"vgetexp|vgetmant|vrndscale|vrcp14|vrsqrt14|vscalef|vcvt[a-z0-9]*2u|vcvtu|kmov|kor|kand|kxor|knot|ktest|"
    r"kortest|kshift|vpcmp[a-z]*u?[bwdq] .*%k|valign[dq]|vdbpsadbw|vextract[fi](32x|64x)|vinsert[fi](32x|64x)|"
    r"vbroadcast[fi](32x|64x)|vshuf[fi](32x|64x)|vpmovs?u?[dqw][bwd]\b)")


def check(path):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", path], capture_output=True, text=True,
                         check=True).stdout
    current, offenders, allowed = None, {}, 0
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            current = m.group(1)
            continue
        if current is None or not EVEX.search(line):
            continue
        if "isa_avx512::" in current:
            allowed += 1
        else:
            offenders.setdefault(current, line.strip())
    return allowed, offenders


def main():
    failed = False
    for path in sys.argv[1:]:
        allowed, offenders = check(path)
        print(f"{path}: {allowed} AVX-512 instructions, all inside isa_avx512 functions" if not offenders else
              f"{path}: AVX-512 instructions in {len(offenders)} functions outside isa_avx512:")
        for fn, line in list(offenders.items())[:20]:
            print(f"  {fn[:160]}\n      {line}")
        if allowed == 0:
            print(f"{path}: no AVX-512 variant at all: the isa_avx512 loops were not compiled in")
            failed = True
        failed = failed or bool(offenders)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
