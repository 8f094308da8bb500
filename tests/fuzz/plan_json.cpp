// Fuzz target: the pipeline plan JSON the planner writes and the runtime and chorusrun read
// (distributed/pipeline/plan.h). A chorus::Error or a plan that validates, and whose JSON reads
// back as the same plan (predictions included), valid on the ranks it names.
#include "distributed/pipeline/plan.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace pp = chorus::distributed::pipeline;
  const std::string text(reinterpret_cast<const char*>(data), size);
  pp::PipelinePlan plan;
  try {
    plan = pp::plan_from_json(text);
  } catch (const chorus::Error&) {
    return 0;
  }
  const pp::PipelinePlan again = pp::plan_from_json(pp::plan_to_json(plan));
  chorus::fuzz::check(again.num_layers == plan.num_layers && again.global_batch == plan.global_batch &&
                          again.micro_batches == plan.micro_batches && again.schedule == plan.schedule &&
                          again.stages.size() == plan.stages.size(),
                      "the plan's JSON does not read back as the same plan");
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    chorus::fuzz::check(again.stages[i].first_layer == plan.stages[i].first_layer &&
                            again.stages[i].end_layer == plan.stages[i].end_layer &&
                            again.stages[i].ranks == plan.stages[i].ranks,
                        "a stage does not read back the same");
  }
  chorus::fuzz::check(again.predicted.has_value() == plan.predicted.has_value(), "the predictions do not read back");
  if (plan.predicted) {
    chorus::fuzz::check(again.predicted->iteration_ms == plan.predicted->iteration_ms &&
                            again.predicted->peak_memory_bytes == plan.predicted->peak_memory_bytes &&
                            again.predicted->pivot_stage == plan.predicted->pivot_stage,
                        "the predictions do not read back the same");
  }
  // A plan that was read is valid on the ranks it names, and every one of them has a stage.
  int world = 0;
  for (const auto& s : plan.stages) world += static_cast<int>(s.ranks.size());
  plan.validate(world);
  for (int r = 0; r < world; ++r) (void)plan.stage_of(r);
  return 0;
}
