// A pipeline plan: how a model of num_layers layers is cut into stages, which global ranks run
// each stage (several ranks = data-parallel replicas of that stage), how the global batch is cut
// into micro-batches, which schedule runs them, and (when the planner wrote it) what the planner
// predicted. One type for both sides: the DAPPLE planner (distributed/pipeline/planner) writes it,
// the runtime (pipeline.h) reads it.
//
//   {"version":1,"num_layers":8,"global_batch":32,"micro_batches":4,"schedule":"1f1b",
//    "stages":[{"layers":[0,4],"ranks":[0,1]},{"layers":[4,8],"ranks":[2]}],
//    "predicted":{"iteration_ms":12.5,"peak_memory_bytes":[1000,800],"pivot_stage":0}}
//
// "predicted" is optional; the runtime ignores it, the planner's tools compare it with measurements.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace chorus::distributed::pipeline {

struct StagePlan {
  int first_layer = 0;  // layers [first_layer, end_layer) of the model
  int end_layer = 0;
  std::vector<int> ranks;  // global ranks; replica j of the stage is ranks[j]

  int replicas() const { return static_cast<int>(ranks.size()); }
};

// The planner's estimates for a plan (cost_model.h).
struct PlanPrediction {
  double iteration_ms = 0;
  std::vector<int64_t> peak_memory_bytes;  // per stage, per device of the stage
  int pivot_stage = 0;
};

struct PipelinePlan {
  int num_layers = 0;
  int64_t global_batch = 0;
  int micro_batches = 1;
  // "1f1b" (DAPPLE's early backward), "gpipe", or "interleaved" (Megatron-LM's interleaved 1F1B:
  // `stages` are then virtual stages whose ranks repeat every num_positions() stages, each group of
  // ranks holding chunks() of them, e.g. 4 virtual stages on ranks [0], [1], [0], [1]).
  std::string schedule = "1f1b";
  std::vector<StagePlan> stages;
  std::optional<PlanPrediction> predicted;

  int num_stages() const { return static_cast<int>(stages.size()); }
  // Interleaved: the number of distinct groups of ranks (pipeline positions) and the virtual stages
  // each holds; otherwise num_stages() and 1.
  int num_positions() const;
  int chunks() const { return num_stages() / num_positions(); }
  int64_t micro_batch_size() const { return global_batch / micro_batches; }
  // The stage `rank` runs (interleaved: its position, the first of its virtual stages); chorus::Error
  // when no stage has it.
  int stage_of(int rank) const;
  // Throws chorus::Error naming what was given and what was expected when the plan is not one the
  // runtime can run on `world_size` processes: layers must tile [0, num_layers) in order without
  // gaps or overlaps, every rank in [0, world_size) must be in exactly one stage, the micro-batch
  // size (global_batch / micro_batches, exact) must divide among every stage's replicas, and the
  // schedule must be known. world_size < 0 skips the rank-count check (ranks are still checked to
  // be distinct and non-negative).
  void validate(int world_size = -1) const;
  // "[0,4) x2 on ranks 0,1 | [4,8) x1 on rank 2"
  std::string str() const;
};

// Strict JSON (distributed/pipeline/json_fields.h): "version" must be 1; unknown keys (top level,
// in a stage, in "predicted": a misspelt key must not be silently ignored) and wrong types are a
// chorus::Error naming `source`, the key path and what was expected. The plan is validated against
// the ranks it names (every rank in [0, largest rank] used once).
PipelinePlan plan_from_json(const std::string& text, const std::string& source = "plan");
std::string plan_to_json(const PipelinePlan& plan);
PipelinePlan load_plan(const std::string& path);
// Atomic: written to a temporary file renamed over `path`.
void save_plan(const PipelinePlan& plan, const std::string& path);

// A plan from stage boundaries: stage i runs layers [cuts[i-1], cuts[i]) with cuts[-1] = 0 and
// cuts[S-1] = num_layers implied, i.e. `cuts` lists the S-1 interior boundaries; stage i gets
// replicas[i] consecutive ranks (stage 0 ranks 0..replicas[0]-1, and so on). Validated.
PipelinePlan uniform_plan(int num_layers, const std::vector<int>& cuts, const std::vector<int>& replicas,
                          int64_t global_batch, int micro_batches, const std::string& schedule);
// S-1 interior boundaries cutting num_layers layers into S stages of (nearly) equal layer counts.
std::vector<int> even_cuts(int num_layers, int num_stages);

}  // namespace chorus::distributed::pipeline
