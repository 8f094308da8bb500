// The VmFlags line of the mapping that holds an address in this process (/proc/self/smaps), for
// tests that check a mapping's advice ("hg": MADV_HUGEPAGE) on CPU blocks and sim segments.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace chorus::testing {

// "" when no mapping holds `p`.
inline std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    // A mapping's first line is "lo-hi perms ..."; its field lines ("Size:", "VmFlags:") never
    // parse as two hex numbers joined by '-'.
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) inside = addr >= lo && addr < hi;
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

}  // namespace chorus::testing
