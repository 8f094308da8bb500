// Human-readable text for plans and predictions: a table of stages (layers, replicas, ranks, nodes,
// per-micro-batch forward/backward, transfer, allreduce, peak memory) and the iteration breakdown.
// Used by the `plan` tool and the projection benchmark.
#pragma once

#include <string>

#include "distributed/pipeline/planner/cluster.h"
#include "distributed/pipeline/planner/cost_model.h"
#include "distributed/pipeline/plan.h"
#include "distributed/pipeline/planner/profile.h"

namespace chorus::distributed::pipeline::planner {

std::string describe_plan(const PipelinePlan& plan, const Prediction& prediction, const ModelProfile& profile,
                          const Cluster& cluster);

// "1.50 GiB"
std::string format_bytes(double bytes);

}  // namespace chorus::distributed::pipeline::planner
