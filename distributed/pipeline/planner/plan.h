// A pipeline plan as the planner writes it and the pipeline runtime reads it: stages with their
// layer ranges (half-open) and global ranks (several ranks = data-parallel replicas of the stage),
// the global batch and the number of micro-batches, the schedule, and the planner's predictions.
//
//   {"version":1,"num_layers":8,"global_batch":32,"micro_batches":4,"schedule":"1f1b",
//    "stages":[{"layers":[0,4],"ranks":[0,1]},{"layers":[4,8],"ranks":[2]}],
//    "predicted":{"iteration_ms":12.5,"peak_memory_bytes":[1000,800],"pivot_stage":0}}
//
// The runtime's own reader is distributed/pipeline/plan.h; this one is the planner's (it also
// reads "predicted" back, so a plan's prediction can be compared with a measurement later).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace chorus::distributed::pipeline::planner {

struct StagePlan {
  int first_layer = 0;  // layers [first_layer, end_layer)
  int end_layer = 0;
  std::vector<int> ranks;  // global ranks, node * devices_per_node + local device

  int replicas() const { return static_cast<int>(ranks.size()); }
};

struct PlanPrediction {
  double iteration_ms = 0;
  std::vector<int64_t> peak_memory_bytes;  // per stage, per device of the stage
  int pivot_stage = 0;
};

struct Plan {
  int num_layers = 0;
  int64_t global_batch = 0;
  int micro_batches = 1;
  std::string schedule = "1f1b";  // "1f1b" (DAPPLE's early backward) or "gpipe"
  std::vector<StagePlan> stages;
  std::optional<PlanPrediction> predicted;

  int num_stages() const { return static_cast<int>(stages.size()); }
  int64_t micro_batch_size() const { return global_batch / micro_batches; }
  // chorus::Error naming what was given and what was expected unless: stages tile [0, num_layers)
  // in order, each with at least one rank; ranks are distinct and in [0, world_size) and, when
  // world_size > 0, all of them are used; global_batch is a multiple of micro_batches; every stage's
  // replica count divides the micro-batch size; the schedule is "1f1b" or "gpipe".
  void validate(int world_size) const;
  // "[0,4) x2 on ranks 0,1 | [4,8) x1 on rank 2"
  std::string str() const;
};

// Strict JSON: "version" must be 1; unknown keys (top level, in a stage, in "predicted") and wrong
// types are a chorus::Error naming `source`, the key and what was expected. The plan is validated
// (world size: the ranks it names).
Plan plan_from_json(const std::string& text, const std::string& source = "plan");
std::string plan_to_json(const Plan& plan);
Plan load_plan(const std::string& path);
void save_plan(const Plan& plan, const std::string& path);

}  // namespace chorus::distributed::pipeline::planner
