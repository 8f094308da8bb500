// What the example programs share: joining the job chorusrun started (or running alone), rank-0
// logging, ETA strings and parameter counts.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "distributed/init.h"
#include "nn/nn.h"

namespace chorus::examples {

struct Job {
  std::shared_ptr<distributed::ProcessGroup> group;  // null when running alone
  int rank = 0;
  int world = 1;

  // Data parallel when launched with a world size above 1 (chorusrun sets WORLD_SIZE, RANK, ...).
  static Job join() {
    Job job;
    if (const char* ws = std::getenv("WORLD_SIZE"); ws != nullptr && std::atoi(ws) > 1) {
      job.group = distributed::init_process_group();
      job.rank = job.group->rank();
      job.world = job.group->size();
    }
    return job;
  }

  // Prints a line on rank 0 only, flushed at once (progress under chorusrun arrives line by line).
  void log(const std::string& line) const {
    if (rank != 0) return;
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  }

  // Rank 0 hosts the store: every rank waits for the others before the group goes away.
  void finish() {
    if (!group) return;
    group->barrier()->wait();
    distributed::destroy_process_group();
    group.reset();
  }
};

inline std::string eta_str(double seconds) {
  const int s = static_cast<int>(seconds + 0.5);
  return s >= 60 ? fmt::format("{}m{:02d}s", s / 60, s % 60) : fmt::format("{}s", s);
}

inline int64_t count_parameters(nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace chorus::examples
