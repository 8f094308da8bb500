// Strict reading of the pipeline's JSON files (the plan; the planner's profile and cluster): every
// object lists the keys it accepts, and a missing key, an unknown key or a value of the wrong type is a chorus::Error
// that names the file's role, the key path, what was given and what was expected. One set of
// helpers so that the three readers word their errors the same way.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tensor/error.h"

namespace chorus::distributed::pipeline::json_fields {

using Json = nlohmann::json;

inline std::string type_of(const Json& j) {
  if (j.is_number_integer() || j.is_number_unsigned()) return "integer";
  if (j.is_number_float()) return "number";
  return j.type_name();
}

// Parses text; a syntax error names `what` (e.g. "profile file profile.json").
inline Json parse(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    fail("{}: not valid JSON ({})", what, e.what());
  }
}

// `j` must be an object whose keys are all in `allowed`, with every key of `required` present.
inline void check_object(const Json& j, const std::string& path, std::initializer_list<const char*> required,
                         std::initializer_list<const char*> optional = {}) {
  if (!j.is_object()) fail("{}: got a JSON {}, expected an object", path, type_of(j));
  for (const char* key : required)
    if (!j.contains(key)) fail("{}: missing key \"{}\" (expected keys: {})", path, key, fmt::join(required, ", "));
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* key : required) known = known || it.key() == key;
    for (const char* key : optional) known = known || it.key() == key;
    if (!known) {
      std::vector<std::string> all(required.begin(), required.end());
      all.insert(all.end(), optional.begin(), optional.end());
      fail("{}: unknown key \"{}\" (expected only: {})", path, it.key(), fmt::join(all, ", "));
    }
  }
}

// A finite number >= minimum.
inline double number(const Json& j, const std::string& path, double minimum = 0.0) {
  if (!j.is_number()) fail("{}: got a JSON {} ({}), expected a number", path, type_of(j), j.dump());
  const double v = j.get<double>();
  if (!std::isfinite(v) || v < minimum) fail("{}: got {}, expected a finite number >= {}", path, j.dump(), minimum);
  return v;
}

// An integer in [minimum, maximum] (a float with an integral value such as 1e9 is accepted: cluster
// files write bandwidths and sizes that way).
inline int64_t integer(const Json& j, const std::string& path, int64_t minimum = 0,
                       int64_t maximum = std::numeric_limits<int64_t>::max()) {
  if (!j.is_number()) fail("{}: got a JSON {} ({}), expected an integer", path, type_of(j), j.dump());
  const double v = j.get<double>();
  if (j.is_number_float() && (v != std::floor(v) || std::abs(v) > 9.0e15))
    fail("{}: got {}, expected an integer", path, j.dump());
  const int64_t i = j.is_number_float() ? static_cast<int64_t>(v) : j.get<int64_t>();
  if (i < minimum || i > maximum) fail("{}: got {}, expected an integer in [{}, {}]", path, i, minimum, maximum);
  return i;
}

inline std::string string(const Json& j, const std::string& path) {
  if (!j.is_string()) fail("{}: got a JSON {} ({}), expected a string", path, type_of(j), j.dump());
  return j.get<std::string>();
}

inline const Json& array(const Json& j, const std::string& path) {
  if (!j.is_array()) fail("{}: got a JSON {}, expected an array", path, type_of(j));
  return j;
}

// The whole file at `path`; a missing or unreadable file names `what` and the path.
inline std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open \"{}\" for reading", what, path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes through a temporary file renamed over `path`, so a reader sees the old file or the new one.
inline void write_file(const std::string& path, const std::string& text, const std::string& what) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) fail("{}: cannot open \"{}\" for writing", what, temp);
    out << text;
    if (!out.flush()) fail("{}: writing \"{}\" failed", what, temp);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) fail("{}: cannot rename \"{}\" to \"{}\"", what, temp, path);
}

}  // namespace chorus::distributed::pipeline::json_fields
