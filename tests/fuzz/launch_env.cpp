// Fuzz target: where a process sits in the job, from launcher variables (distributed::launch_env_from):
// the input is lines NAME=VALUE (RANK, WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*, MASTER_ADDR/PORT, ...).
// A chorus::Error, or a rank inside the world and a port in range; SLURM host lists through
// slurm_first_host.
#include <map>
#include <sstream>

#include "distributed/init.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace cd = chorus::distributed;
  std::map<std::string, std::string> env;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  try {
    const cd::LaunchEnv e = cd::launch_env_from([&](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
    if (e.world_size >= 0) {
      chorus::fuzz::check(e.world_size >= 1 && e.rank >= 0 && e.rank < e.world_size, "a rank outside its world");
    }
    if (e.master_port >= 0) chorus::fuzz::check(e.master_port <= 65535, "a port above 65535");
  } catch (const chorus::Error&) {
  }
  for (const char* key : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    auto it = env.find(key);
    if (it == env.end()) continue;
    try {
      const std::string host = cd::slurm_first_host(it->second);
      chorus::fuzz::check(!host.empty(), "an empty first host");
    } catch (const chorus::Error&) {
    }
  }
  return 0;
}
