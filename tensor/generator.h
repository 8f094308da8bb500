// Seeded random number generation. A Generator is a Philox-4x32-10 counter-based stream: the same
// seed gives the same numbers on every machine, and the state is just (seed, offset), so it can be
// saved in a checkpoint and restored exactly. manual_seed() seeds the default generator.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

namespace chorus {

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull) { manual_seed(seed); }

  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() const { return seed_; }
  // Number of 128-bit Philox blocks consumed so far; (seed, offset) is the whole state.
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }

  // Reserves `blocks` consecutive Philox blocks and returns the first block's counter, so a kernel
  // can generate them (even in parallel) with philox(seed(), counter + i).
  uint64_t reserve_blocks(uint64_t blocks) {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t start = offset_;
    offset_ += blocks;
    return start;
  }

  // Four independent 32-bit random words for (key, counter).
  static std::array<uint32_t, 4> philox(uint64_t key, uint64_t counter);
  // Helpers mapping random bits to distributions.
  static float uniform_float(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }
  static double uniform_double(uint32_t hi, uint32_t lo) {
    uint64_t v = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
    return static_cast<double>(v & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
  }

 private:
  std::mutex mutex_;
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

// The process-wide default generator used when an op is given none.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace chorus
