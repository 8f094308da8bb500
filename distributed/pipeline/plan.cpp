#include "distributed/pipeline/plan.h"

#include <climits>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/error.h"

namespace chorus::distributed::pipeline {

int PipelinePlan::stage_of(int rank) const {
  for (size_t s = 0; s < stages.size(); ++s) {
    for (int r : stages[s].ranks) if (r == rank) return static_cast<int>(s);
  }
  fail("pipeline plan: rank {} is in no stage (the stages hold ranks {})", rank,
       fmt::join([&] {
         std::vector<std::string> v;
         for (const auto& st : stages) v.push_back(fmt::format("{}", st.ranks));
         return v;
       }(), ", "));
}

void PipelinePlan::validate(int world_size) const {
  if (num_layers <= 0) fail("pipeline plan: num_layers is {}; expected a positive number of layers", num_layers);
  if (stages.empty()) fail("pipeline plan: no stages; expected at least one stage covering layers [0, {})", num_layers);
  if (schedule != "gpipe" && schedule != "1f1b") {
    fail("pipeline plan: schedule '{}' is unknown; expected \"gpipe\" or \"1f1b\"", schedule);
  }
  if (micro_batches <= 0) fail("pipeline plan: micro_batches is {}; expected at least 1", micro_batches);
  if (global_batch <= 0) fail("pipeline plan: global_batch is {}; expected a positive batch size", global_batch);
  if (global_batch % micro_batches != 0) {
    fail("pipeline plan: global_batch {} does not split into {} equal micro-batches; expected a multiple of "
         "micro_batches",
         global_batch, micro_batches);
  }
  int expect_first = 0;
  std::map<int, int> owner;  // rank -> stage
  for (size_t s = 0; s < stages.size(); ++s) {
    const StagePlan& st = stages[s];
    if (st.first_layer != expect_first) {
      fail("pipeline plan: stage {} starts at layer {} but the previous stage ends at layer {}: layers must be "
           "contiguous without {} (stage {} should start at layer {})",
           s, st.first_layer, expect_first, st.first_layer > expect_first ? "gaps" : "overlaps", s, expect_first);
    }
    if (st.end_layer <= st.first_layer) {
      fail("pipeline plan: stage {} has layers [{}, {}); expected at least one layer (end > first)", s, st.first_layer,
           st.end_layer);
    }
    if (st.end_layer > num_layers) {
      fail("pipeline plan: stage {} has layers [{}, {}) but the model has {} layers", s, st.first_layer, st.end_layer,
           num_layers);
    }
    expect_first = st.end_layer;
    if (st.ranks.empty()) fail("pipeline plan: stage {} (layers [{}, {})) has no ranks", s, st.first_layer, st.end_layer);
    for (int r : st.ranks) {
      if (r < 0 || (world_size >= 0 && r >= world_size)) {
        fail("pipeline plan: stage {} names rank {}; expected ranks in [0, {})", s, r,
             world_size >= 0 ? fmt::format("{}", world_size) : std::string("world size"));
      }
      auto [it, fresh] = owner.emplace(r, static_cast<int>(s));
      if (!fresh) {
        fail("pipeline plan: rank {} is in stage {} and again in stage {}; expected every rank in exactly one stage "
             "(once)",
             r, it->second, s);
      }
    }
    const int mb = global_batch / micro_batches;
    if (mb % static_cast<int>(st.ranks.size()) != 0) {
      fail("pipeline plan: the micro-batch of {} samples (global_batch {} / micro_batches {}) does not split among "
           "stage {}'s {} replicas; expected a micro-batch size divisible by every stage's replica count",
           mb, global_batch, micro_batches, s, st.ranks.size());
    }
  }
  if (expect_first != num_layers) {
    fail("pipeline plan: the stages cover layers [0, {}) but the model has {} layers; expected the last stage to end "
         "at layer {}",
         expect_first, num_layers, num_layers);
  }
  if (world_size >= 0 && static_cast<int>(owner.size()) != world_size) {
    std::vector<int> missing;
    for (int r = 0; r < world_size; ++r) if (!owner.count(r)) missing.push_back(r);
    fail("pipeline plan: the stages hold {} ranks but the world size is {}; expected every rank in [0, {}) in exactly "
         "one stage (missing: {})",
         owner.size(), world_size, world_size, missing);
  }
}

namespace {

using nlohmann::json;

// An integer field, strictly: a JSON integer within int's range (nlohmann's get<int> would truncate
// 4294967297 to 1 and cast 3e72 with undefined behaviour).
int as_int(const json& v, const std::string& what, const std::string& where) {
  if (v.is_number_integer()) {
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(INT_MAX)
                                             : v.get<int64_t>() >= INT_MIN && v.get<int64_t>() <= INT_MAX;
    if (fits) return static_cast<int>(v.get<int64_t>());
  }
  fail("pipeline plan JSON: {} in {} is {}; expected an integer in [{}, {}]", what, where, v.dump(), INT_MIN, INT_MAX);
}

int int_field(const json& j, const char* key, const char* where) {
  if (!j.contains(key)) fail("pipeline plan JSON: {} has no \"{}\"", where, key);
  return as_int(j.at(key), fmt::format("\"{}\"", key), where);
}

std::string string_field(const json& j, const char* key, const char* where) {
  if (!j.contains(key)) fail("pipeline plan JSON: {} has no \"{}\"", where, key);
  if (!j.at(key).is_string()) fail("pipeline plan JSON: \"{}\" in {} is {}; expected a string", key, where, j.at(key).dump());
  return j.at(key).get<std::string>();
}

std::vector<int> int_list(const json& st, const char* key, const std::string& where) {
  if (!st.contains(key) || !st.at(key).is_array()) {
    fail("pipeline plan JSON: {} is {}; expected {{\"layers\": [first, end], \"ranks\": [r, ...]}}", where, st.dump());
  }
  std::vector<int> out;
  for (const json& v : st.at(key)) out.push_back(as_int(v, fmt::format("an element of \"{}\"", key), where));
  return out;
}

}  // namespace

PipelinePlan plan_from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("pipeline plan JSON: cannot parse: {}", e.what());
  }
  if (!j.is_object()) fail("pipeline plan JSON: expected an object at the top, got {}", j.type_name());
  for (auto it = j.begin(); it != j.end(); ++it) {
    static const char* known[] = {"version", "num_layers", "global_batch", "micro_batches", "schedule", "stages",
                                  "predicted"};
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) {
      fail("pipeline plan JSON: unknown key \"{}\"; expected only version, num_layers, global_batch, micro_batches, "
           "schedule, stages and (optional) predicted",
           it.key());
    }
  }
  const int version = int_field(j, "version", "the plan");
  if (version != 1) fail("pipeline plan JSON: version {} is not supported; expected version 1", version);
  PipelinePlan p;
  p.num_layers = int_field(j, "num_layers", "the plan");
  p.global_batch = int_field(j, "global_batch", "the plan");
  p.micro_batches = int_field(j, "micro_batches", "the plan");
  p.schedule = string_field(j, "schedule", "the plan");
  if (!j.contains("stages") || !j["stages"].is_array()) fail("pipeline plan JSON: expected an array \"stages\"");
  int s = 0;
  for (const json& st : j["stages"]) {
    const std::string where = fmt::format("stage {}", s++);
    if (!st.is_object()) fail("pipeline plan JSON: {} is {}; expected an object with layers and ranks", where, st.dump());
    for (auto it = st.begin(); it != st.end(); ++it) {
      if (it.key() != "layers" && it.key() != "ranks") {
        fail("pipeline plan JSON: {} has an unknown key \"{}\"; expected only \"layers\" and \"ranks\"", where, it.key());
      }
    }
    const std::vector<int> layers = int_list(st, "layers", where);
    const std::vector<int> ranks = int_list(st, "ranks", where);
    if (layers.size() != 2) {
      fail("pipeline plan JSON: {} has layers {}; expected [first, end] (two numbers, end exclusive)", where, layers);
    }
    p.stages.push_back({layers[0], layers[1], ranks});
  }
  p.validate();
  return p;
}

std::string plan_to_json(const PipelinePlan& plan) {
  json stages = json::array();
  for (const StagePlan& st : plan.stages) stages.push_back({{"layers", {st.first_layer, st.end_layer}}, {"ranks", st.ranks}});
  json j = {{"version", 1},
            {"num_layers", plan.num_layers},
            {"global_batch", plan.global_batch},
            {"micro_batches", plan.micro_batches},
            {"schedule", plan.schedule},
            {"stages", stages}};
  return j.dump();
}

PipelinePlan load_plan(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("pipeline plan: cannot read '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return plan_from_json(ss.str());
  } catch (const Error& e) {
    fail("{} (in '{}')", e.what(), path);
  }
}

void save_plan(const PipelinePlan& plan, const std::string& path) {
  std::ofstream out(path);
  if (!out) fail("pipeline plan: cannot write '{}'", path);
  out << plan_to_json(plan) << "\n";
  if (!out) fail("pipeline plan: writing '{}' failed", path);
}

std::vector<int> even_cuts(int num_layers, int num_stages) {
  if (num_stages <= 0 || num_stages > num_layers) {
    fail("pipeline: cannot cut {} layers into {} stages; expected 1 to {} stages", num_layers, num_stages, num_layers);
  }
  std::vector<int> cuts;
  for (int i = 1; i < num_stages; ++i) cuts.push_back(static_cast<int>(static_cast<int64_t>(num_layers) * i / num_stages));
  return cuts;
}

PipelinePlan uniform_plan(int num_layers, const std::vector<int>& cuts, const std::vector<int>& replicas,
                          int global_batch, int micro_batches, const std::string& schedule) {
  if (replicas.size() != cuts.size() + 1) {
    fail("pipeline: {} stage boundaries make {} stages but {} replica counts were given; expected one per stage",
         cuts.size(), cuts.size() + 1, replicas.size());
  }
  PipelinePlan p;
  p.num_layers = num_layers;
  p.global_batch = global_batch;
  p.micro_batches = micro_batches;
  p.schedule = schedule;
  int rank = 0;
  for (size_t s = 0; s < replicas.size(); ++s) {
    StagePlan st;
    st.first_layer = s == 0 ? 0 : cuts[s - 1];
    st.end_layer = s == cuts.size() ? num_layers : cuts[s];
    if (replicas[s] <= 0) fail("pipeline: stage {} has {} replicas; expected at least 1", s, replicas[s]);
    for (int k = 0; k < replicas[s]; ++k) st.ranks.push_back(rank++);
    p.stages.push_back(st);
  }
  p.validate(rank);
  return p;
}

}  // namespace chorus::distributed::pipeline
