// Plan: validation, description and JSON (see plan.h).
#include "distributed/pipeline/planner/plan.h"

#include <set>

#include "distributed/pipeline/planner/json_fields.h"

namespace chorus::distributed::pipeline::planner {

namespace jf = json_fields;

void Plan::validate(int world_size) const {
  if (num_layers < 1) fail("plan: got num_layers = {}, expected at least 1", num_layers);
  if (micro_batches < 1) fail("plan: got micro_batches = {}, expected at least 1", micro_batches);
  if (global_batch < 1 || global_batch % micro_batches != 0)
    fail("plan: global_batch {} is not divisible by micro_batches {} (expected a positive multiple)", global_batch,
         micro_batches);
  if (schedule != "1f1b" && schedule != "gpipe")
    fail("plan: got schedule \"{}\", expected \"1f1b\" or \"gpipe\"", schedule);
  if (stages.empty()) fail("plan: got no stages, expected at least one");
  std::set<int> seen;
  int next = 0;
  for (int s = 0; s < num_stages(); ++s) {
    const StagePlan& st = stages[s];
    if (st.first_layer != next || st.end_layer <= st.first_layer || st.end_layer > num_layers)
      fail("plan: stage {} has layers [{}, {}), expected [{}, e) with {} < e <= {} (stages tile the {} layers in order)",
           s, st.first_layer, st.end_layer, next, next, num_layers, num_layers);
    next = st.end_layer;
    if (st.ranks.empty()) fail("plan: stage {} has no ranks, expected at least one", s);
    for (int r : st.ranks) {
      if (r < 0 || (world_size > 0 && r >= world_size))
        fail("plan: stage {} names rank {}, expected a rank in [0, {})", s, r, world_size > 0 ? world_size : 1 << 30);
      if (!seen.insert(r).second) fail("plan: rank {} appears in two stages or twice in stage {}, expected once", r, s);
    }
    if (micro_batch_size() % st.replicas() != 0)
      fail("plan: stage {} has {} replicas, which do not divide the micro-batch of {} samples (global batch {} / {} "
           "micro-batches); expected a replica count dividing {}",
           s, st.replicas(), micro_batch_size(), global_batch, micro_batches, micro_batch_size());
  }
  if (next != num_layers) fail("plan: stages end at layer {}, expected them to cover all {} layers", next, num_layers);
  if (world_size > 0 && static_cast<int>(seen.size()) != world_size)
    fail("plan: uses {} ranks, expected all {} devices of the cluster", seen.size(), world_size);
}

std::string Plan::str() const {
  std::string out;
  for (int s = 0; s < num_stages(); ++s) {
    const StagePlan& st = stages[s];
    out += fmt::format("{}[{},{}) x{} on rank{} {}", s ? " | " : "", st.first_layer, st.end_layer, st.replicas(),
                       st.replicas() > 1 ? "s" : "", fmt::join(st.ranks, ","));
  }
  return out;
}

Plan plan_from_json(const std::string& text, const std::string& source) {
  const jf::Json j = jf::parse(text, source);
  jf::check_object(j, source, {"version", "num_layers", "global_batch", "micro_batches", "schedule", "stages"},
                   {"predicted"});
  const int64_t version = jf::integer(j["version"], source + ".version");
  if (version != 1) fail("{}.version: got {}, expected 1", source, version);
  Plan p;
  p.num_layers = static_cast<int>(jf::integer(j["num_layers"], source + ".num_layers", 1, 1 << 30));
  p.global_batch = jf::integer(j["global_batch"], source + ".global_batch", 1);
  p.micro_batches = static_cast<int>(jf::integer(j["micro_batches"], source + ".micro_batches", 1, 1 << 30));
  p.schedule = jf::string(j["schedule"], source + ".schedule");
  const jf::Json& stages = jf::array(j["stages"], source + ".stages");
  int max_rank = -1;
  for (size_t s = 0; s < stages.size(); ++s) {
    const std::string path = fmt::format("{}.stages[{}]", source, s);
    jf::check_object(stages[s], path, {"layers", "ranks"});
    const jf::Json& layers = jf::array(stages[s]["layers"], path + ".layers");
    if (layers.size() != 2) fail("{}.layers: got {} numbers, expected [first, end]", path, layers.size());
    StagePlan st;
    st.first_layer = static_cast<int>(jf::integer(layers[0], path + ".layers[0]", 0, 1 << 30));
    st.end_layer = static_cast<int>(jf::integer(layers[1], path + ".layers[1]", 0, 1 << 30));
    const jf::Json& ranks = jf::array(stages[s]["ranks"], path + ".ranks");
    for (size_t i = 0; i < ranks.size(); ++i) {
      st.ranks.push_back(static_cast<int>(jf::integer(ranks[i], fmt::format("{}.ranks[{}]", path, i), 0, 1 << 30)));
      max_rank = std::max(max_rank, st.ranks.back());
    }
    p.stages.push_back(std::move(st));
  }
  if (j.contains("predicted")) {
    const std::string path = source + ".predicted";
    jf::check_object(j["predicted"], path, {"iteration_ms", "peak_memory_bytes", "pivot_stage"});
    PlanPrediction pr;
    pr.iteration_ms = jf::number(j["predicted"]["iteration_ms"], path + ".iteration_ms");
    const jf::Json& mem = jf::array(j["predicted"]["peak_memory_bytes"], path + ".peak_memory_bytes");
    for (size_t i = 0; i < mem.size(); ++i)
      pr.peak_memory_bytes.push_back(jf::integer(mem[i], fmt::format("{}.peak_memory_bytes[{}]", path, i)));
    if (pr.peak_memory_bytes.size() != p.stages.size())
      fail("{}.peak_memory_bytes: got {} values, expected one per stage ({})", path, pr.peak_memory_bytes.size(),
           p.stages.size());
    pr.pivot_stage = static_cast<int>(
        jf::integer(j["predicted"]["pivot_stage"], path + ".pivot_stage", 0, std::max<int64_t>(0, p.num_stages() - 1)));
    p.predicted = std::move(pr);
  }
  p.validate(max_rank + 1);
  return p;
}

std::string plan_to_json(const Plan& p) {
  nlohmann::ordered_json j;
  j["version"] = 1;
  j["num_layers"] = p.num_layers;
  j["global_batch"] = p.global_batch;
  j["micro_batches"] = p.micro_batches;
  j["schedule"] = p.schedule;
  j["stages"] = nlohmann::ordered_json::array();
  for (const StagePlan& st : p.stages) {
    nlohmann::ordered_json s;
    s["layers"] = {st.first_layer, st.end_layer};
    s["ranks"] = st.ranks;
    j["stages"].push_back(std::move(s));
  }
  if (p.predicted) {
    nlohmann::ordered_json pr;
    pr["iteration_ms"] = p.predicted->iteration_ms;
    pr["peak_memory_bytes"] = p.predicted->peak_memory_bytes;
    pr["pivot_stage"] = p.predicted->pivot_stage;
    j["predicted"] = std::move(pr);
  }
  return j.dump() + "\n";
}

Plan load_plan(const std::string& path) { return plan_from_json(jf::read_file(path, "plan"), "plan " + path); }

void save_plan(const Plan& plan, const std::string& path) { jf::write_file(path, plan_to_json(plan), "plan"); }

}  // namespace chorus::distributed::pipeline::planner
