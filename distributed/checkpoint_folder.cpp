#include "distributed/checkpoint_folder.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace chorus::distributed {

nlohmann::json read_checkpoint_index(const std::string& path, const std::string& folder, const std::string& kind,
                                     const std::string& what, const std::vector<std::string>& required) {
  std::ifstream in(path);
  if (!in) fail("{}: no {} {} (is {} a {}'s folder?)", kind, what, path, folder, kind);
  nlohmann::json m;
  try {
    in >> m;
  } catch (const std::exception& e) {
    fail("{}: the {} {} is not valid JSON: {}", kind, what, path, e.what());
  }
  bool complete = m.is_object();
  for (const std::string& key : required) complete = complete && m.contains(key);
  if (!complete) fail("{}: the {} {} lacks one of {}", kind, what, path, fmt::join(required, ", "));
  return m;
}

void agree_on_failure(ProcessGroup& group, const std::string& error, const std::string& who, const std::string& what) {
  Tensor failed = full({1}, error.empty() ? 0.0 : 1.0, {.dtype = kFloat64});
  if (group.size() > 1) group.allreduce({failed})->wait();
  const int n = static_cast<int>(failed.item<double>());
  if (!error.empty()) fail("{}: {} failed: {}", who, what, error);
  if (n > 0) fail("{}: {} failed on {} other rank(s) (their errors name the cause)", who, what, n);
}

std::string agree_generation(ProcessGroup& group, bool reuse_names) {
  Tensor gen = full({1}, reuse_names ? 1.0 : 0.0, {.dtype = kFloat64});
  if (group.size() > 1) group.allreduce({gen})->wait();
  return gen.item<double>() > 0 ? "b" : "";
}

void remove_superseded(const std::string& dir, const std::string& prefix, const std::string& suffix,
                       const std::string& keep) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name != keep && name.rfind(prefix, 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      fs::remove(e.path(), ec);
    }
  }
}

}  // namespace chorus::distributed
