#include "distributed/pipeline/plan.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "distributed/pipeline/json_fields.h"
#include "tensor/error.h"

namespace chorus::distributed::pipeline {

namespace jf = json_fields;

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

int PipelinePlan::num_positions() const {
  if (schedule != "interleaved") return num_stages();
  for (int p = 1; p < num_stages(); ++p) {
    std::vector<int> a = stages[p].ranks, b = stages[0].ranks;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a == b) return p;
  }
  return num_stages();
}

void PipelinePlan::validate(int world_size) const {
  if (num_layers <= 0) fail("pipeline plan: num_layers is {}; expected a positive number of layers", num_layers);
  if (stages.empty()) fail("pipeline plan: no stages; expected at least one stage covering layers [0, {})", num_layers);
  if (schedule != "gpipe" && schedule != "1f1b" && schedule != "interleaved") {
    fail("pipeline plan: schedule '{}' is unknown; expected \"gpipe\", \"1f1b\" or \"interleaved\"", schedule);
  }
  // Interleaved: the ranks of stage k are those of stage k mod P, for P positions holding V >= 2
  // virtual stages each; micro-batches a multiple of P (interleaved_schedule's condition).
  const int positions = num_positions();
  if (schedule == "interleaved") {
    const int K = num_stages();
    if (positions < 2 || K % positions != 0 || K / positions < 2) {
      fail("pipeline plan: an interleaved plan of {} stages whose ranks repeat every {} stages; expected the ranks of "
           "stage k to be those of stage k mod P for P >= 2 positions, each holding at least 2 stages",
           K, positions);
    }
    for (int k = 0; k < K; ++k) {
      if (stages[k].ranks != stages[k % positions].ranks) {
        fail("pipeline plan: interleaved stage {} has ranks {} but stage {} (the same position) has {}; expected the "
             "same ranks in the same order",
             k, fmt::format("{}", stages[k].ranks), k % positions, fmt::format("{}", stages[k % positions].ranks));
      }
    }
    if (micro_batches % positions != 0) {
      fail("pipeline plan: interleaved over {} positions needs micro_batches a multiple of {}; got {}", positions,
           positions, micro_batches);
    }
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
      if (static_cast<int>(s) >= positions) break;  // interleaved: checked as stage s mod P's above
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
    const int64_t mb = global_batch / micro_batches;
    if (mb % st.replicas() != 0) {
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
    // The first few missing ranks: among the first owner.size() + 8 ranks at least 8 are missing,
    // so this never walks a huge world (a plan naming rank 21111111 once took seconds here).
    std::vector<int> missing;
    const int64_t scan = std::min<int64_t>(world_size, static_cast<int64_t>(owner.size()) + 8);
    for (int r = 0; r < scan && missing.size() < 8; ++r) if (!owner.count(r)) missing.push_back(r);
    fail("pipeline plan: the stages hold {} ranks but the world size is {}; expected every rank in [0, {}) in exactly "
         "one stage (missing: {}{})",
         owner.size(), world_size, world_size, missing, world_size - static_cast<int64_t>(owner.size()) > 8 ? ", ..." : "");
  }
}

std::string PipelinePlan::str() const {
  std::string out;
  for (int s = 0; s < num_stages(); ++s) {
    const StagePlan& st = stages[s];
    out += fmt::format("{}[{},{}) x{} on rank{} {}", s ? " | " : "", st.first_layer, st.end_layer, st.replicas(),
                       st.replicas() > 1 ? "s" : "", fmt::join(st.ranks, ","));
  }
  return out;
}

PipelinePlan plan_from_json(const std::string& text, const std::string& source) {
  const jf::Json j = jf::parse(text, source);
  jf::check_object(j, source, {"version", "num_layers", "global_batch", "micro_batches", "schedule", "stages"},
                   {"predicted"});
  const int64_t version = jf::integer(j["version"], source + ".version");
  if (version != 1) fail("{}.version: got {}, expected 1", source, version);
  PipelinePlan p;
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

std::string plan_to_json(const PipelinePlan& p) {
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

PipelinePlan load_plan(const std::string& path) { return plan_from_json(jf::read_file(path, "plan"), "plan " + path); }

void save_plan(const PipelinePlan& plan, const std::string& path) { jf::write_file(path, plan_to_json(plan), "plan"); }

std::vector<int> even_cuts(int num_layers, int num_stages) {
  if (num_stages <= 0 || num_stages > num_layers) {
    fail("pipeline: cannot cut {} layers into {} stages; expected 1 to {} stages", num_layers, num_stages, num_layers);
  }
  std::vector<int> cuts;
  for (int i = 1; i < num_stages; ++i) cuts.push_back(static_cast<int>(static_cast<int64_t>(num_layers) * i / num_stages));
  return cuts;
}

PipelinePlan uniform_plan(int num_layers, const std::vector<int>& cuts, const std::vector<int>& replicas,
                          int64_t global_batch, int micro_batches, const std::string& schedule) {
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
