// The pipeline flags every example takes (docs/pipeline.md), and the plan they describe:
//
//   --pipeline-stages S   stages (default: --replicas' length, else one per process)
//   --replicas 2,1        processes per stage
//   --micro-batches M     micro-batches per global batch
//   --schedule 1f1b       gpipe or 1f1b
//   --chunks V            interleaved 1F1B: V virtual stages (chunks of the model) per stage
//   --recompute           activation recomputation per stage
//   --plan plan.json      the planner's plan (replaces the four above and the global batch)
//
// With none of them an example trains data-parallel as before; with any, the model's blocks
// (pipeline_blocks()) are cut into stages and every rank reads the same global batches.
#pragma once

#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "distributed/init.h"
#include "distributed/pipeline/pipeline.h"
#include "distributed/store.h"
#include "examples/common/example_util.h"

namespace chorus::examples {

struct PipelineFlags {
  int stages = 0;
  std::string replicas;
  int micro_batches = 4;
  std::string schedule = "1f1b";
  int chunks = 1;
  bool recompute = false;
  std::string plan;
  // Whether any pipeline flag was given (so an example pipelines rather than runs DDP).
  bool enabled() const {
    bool given = stages > 0 || !replicas.empty() || !plan.empty() || chunks > 1 || recompute;
    for (const CLI::Option* o : options) given = given || (o != nullptr && o->count() > 0);
    return given;
  }
  std::vector<const CLI::Option*> options;  // --micro-batches and --schedule (set by add_pipeline_options)
};

inline void add_pipeline_options(CLI::App& app, PipelineFlags& f) {
  app.add_option("--pipeline-stages", f.stages, "pipeline stages (default: --replicas' length, else one per process)")
      ->check(CLI::PositiveNumber);
  app.add_option("--replicas", f.replicas, "pipeline: processes per stage, a comma list (e.g. 2,1)");
  f.options.push_back(app.add_option("--micro-batches", f.micro_batches, "pipeline: micro-batches per global batch")
                          ->check(CLI::PositiveNumber));
  f.options.push_back(
      app.add_option("--schedule", f.schedule, "pipeline schedule: gpipe or 1f1b")->check(CLI::IsMember({"gpipe", "1f1b"})));
  app.add_option("--chunks", f.chunks,
                 "pipeline: model chunks per stage; 2 or more runs Megatron-LM's interleaved 1F1B (micro-batches a "
                 "multiple of the stages)")
      ->check(CLI::Range(1, 64));
  app.add_flag("--recompute", f.recompute,
               "pipeline: activation recomputation (keep only each stage's inputs and outputs per micro-batch, run the "
               "stage's forward again in backward)");
  app.add_option("--plan", f.plan, "a pipeline plan JSON (the planner's); replaces the stage, replica, micro-batch and "
                                   "schedule flags and the global batch");
}

inline std::vector<int> parse_replicas(const std::string& program, const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used != item.size() || item.empty() || n < 1) {
      fail("{}: --replicas must be a comma list of positive counts (e.g. 2,1), got '{}'", program, s);
    }
    out.push_back(n);
  }
  if (out.empty()) fail("{}: --replicas must be a comma list of positive counts (e.g. 2,1), got '{}'", program, s);
  return out;
}

// The plan of the flags for a model of `num_blocks` blocks over `world` processes: --plan's, or
// even cuts of the blocks with the replicas given (or an equal number per stage).
inline distributed::pipeline::PipelinePlan make_pipeline_plan(const std::string& program, const PipelineFlags& f,
                                                              int num_blocks, int world, int64_t global_batch) {
  namespace pp = distributed::pipeline;
  if (!f.plan.empty()) {
    if (f.chunks > 1 || f.stages > 0 || !f.replicas.empty()) {
      fail("{}: --plan replaces --pipeline-stages, --replicas and --chunks; give one or the other", program);
    }
    return pp::load_plan(f.plan);
  }
  std::vector<int> replicas;
  if (!f.replicas.empty()) {
    replicas = parse_replicas(program, f.replicas);
    if (f.stages > 0 && f.stages != static_cast<int>(replicas.size())) {
      fail("{}: --pipeline-stages {} but --replicas lists {} stages ('{}')", program, f.stages, replicas.size(), f.replicas);
    }
  } else {
    const int stages = f.stages > 0 ? f.stages : world;
    if (world % stages != 0) {
      fail("{}: {} processes do not split into {} stages of equal replication; give --replicas", program, world, stages);
    }
    replicas.assign(stages, world / stages);
  }
  const int total = std::accumulate(replicas.begin(), replicas.end(), 0);
  if (total != world) {
    fail("{}: --replicas {} adds up to {} processes, but {} were started", program, f.replicas, total, world);
  }
  const int P = static_cast<int>(replicas.size()), V = f.chunks;
  if (P * V > num_blocks) {
    fail("{}: {} pipeline stages x {} chunks for a model of {} blocks; expected at most one virtual stage per block",
         program, P, V, num_blocks);
  }
  if (V == 1) {
    return pp::uniform_plan(num_blocks, pp::even_cuts(num_blocks, P), replicas, static_cast<int>(global_batch),
                            f.micro_batches, f.schedule);
  }
  if (f.schedule != "1f1b") fail("{}: --chunks {} runs interleaved 1F1B; --schedule {} does not combine with it", program, V, f.schedule);
  // Interleaved: P x V virtual stages cut evenly, virtual stage k on the ranks of stage k mod P.
  std::vector<int> all;
  for (int v = 0; v < V; ++v) all.insert(all.end(), replicas.begin(), replicas.end());
  pp::PipelinePlan plan = pp::uniform_plan(num_blocks, pp::even_cuts(num_blocks, P * V), all,
                                           static_cast<int>(global_batch), f.micro_batches, "1f1b");
  plan.schedule = "interleaved";
  for (int k = P; k < P * V; ++k) plan.stages[k].ranks = plan.stages[k % P].ranks;
  plan.validate(world);
  return plan;
}

// The job's group, or a group of one when running alone (a one-stage pipeline: the same code).
inline std::shared_ptr<distributed::ProcessGroup> pipeline_group(Job& job) {
  if (!job.group) {
    job.group = distributed::init_process_group({.init_method = "tcp://127.0.0.1:0", .rank = 0, .world_size = 1,
                                                 .store = std::make_shared<distributed::TCPStore>(
                                                     "127.0.0.1", 0, distributed::TCPStoreOptions{.is_server = true})});
  }
  return job.group;
}

// What every pipelined example checks before it joins: --amp fp16 is refused (one loss scale
// for all stages is not built); alone, the job gets a group of one (a one-stage pipeline).
inline void join_pipeline(const std::string& program, const std::string& amp, Job& job) {
  if (amp == "fp16") {
    fail("{}: --amp fp16 is not supported with a pipeline yet (one loss scale for all stages is not built); use "
         "--amp bf16",
         program);
  }
  pipeline_group(job);
}

std::string describe(const distributed::pipeline::PipelinePlan& plan);

struct PipelinedModel {
  distributed::pipeline::PipelinePlan plan;
  std::unique_ptr<distributed::pipeline::PipelineStage> stage;
};

// The stage of this rank for `blocks` under the flags' plan, with the examples' options: the
// flags' recomputation, --amp bf16 as autocast, clipping at max_grad_norm (0: none). The plan must
// have the global batch; eval_sequences (0: none) must be at least one global batch, as pipelined
// evaluation takes whole ones. Logs the plan.
inline PipelinedModel make_pipelined_model(const std::string& program, const PipelineFlags& f, const std::string& amp,
                                           distributed::pipeline::BlockModel blocks, const Job& job,
                                           int64_t global_batch, int64_t eval_sequences, double max_grad_norm) {
  namespace pp = distributed::pipeline;
  PipelinedModel out;
  out.plan = make_pipeline_plan(program, f, static_cast<int>(blocks.size()), job.world, global_batch);
  if (out.plan.global_batch != global_batch) {
    fail("{}: the plan's global batch is {}, --batch-size {}; expected the same", program, out.plan.global_batch,
         global_batch);
  }
  if (eval_sequences > 0 && eval_sequences < global_batch) {
    fail("{}: --eval-sequences {} is less than one global batch ({}); a pipeline evaluates whole global batches",
         program, eval_sequences, global_batch);
  }
  pp::PipelineOptions options;
  options.recompute = f.recompute;
  options.max_grad_norm = max_grad_norm;
  if (amp == "bf16") options.autocast = kBFloat16;
  out.stage = std::make_unique<pp::PipelineStage>(std::move(blocks), out.plan, job.group, options);
  job.log(fmt::format("pipeline: {}, world size {}", describe(out.plan), job.world));
  return out;
}

// "3 stages, replicas [2,1,1], 4 micro-batches of 8, schedule 1f1b, blocks [0,3) [3,5) [5,8)"
// (interleaved: "2 stages x 2 chunks, ..., schedule interleaved, blocks ..." with every virtual stage's blocks)
inline std::string describe(const distributed::pipeline::PipelinePlan& plan) {
  std::vector<std::string> replicas, blocks;
  for (int p = 0; p < plan.num_positions(); ++p) replicas.push_back(std::to_string(plan.stages[p].ranks.size()));
  for (const auto& s : plan.stages) blocks.push_back(fmt::format("[{},{})", s.first_layer, s.end_layer));
  const std::string chunks = plan.chunks() > 1 ? fmt::format(" x {} chunks", plan.chunks()) : "";
  return fmt::format("{} stages{}, replicas [{}], {} micro-batches of {}, schedule {}, blocks {}", plan.num_positions(),
                     chunks, fmt::join(replicas, ","), plan.micro_batches, plan.micro_batch_size(), plan.schedule,
                     fmt::join(blocks, " "));
}

}  // namespace chorus::examples
