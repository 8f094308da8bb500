// Pipeline schedules as data: for each stage, the ordered list of actions its ranks perform in one
// training step (every replica of a stage runs the same list). Two generators — GPipe (all
// forwards, then all backwards) and 1F1B / DAPPLE's early backward (stage i admits at most S - i
// micro-batches before its first backward, then alternates one forward and one backward) — and a
// checker that simulates every stage's list with blocking point-to-point semantics (a send
// completes only when the neighbour posts the matching receive, as a rendezvous), reporting
// deadlocks, data-dependency violations, missing or repeated micro-batches, and the peak number of
// micro-batches whose activations each stage holds.
#pragma once

#include <string>
#include <vector>

namespace chorus::distributed::pipeline {

enum class ActionType {
  Forward,         // run the stage's layers on micro-batch m (keeps its activations for backward)
  Backward,        // backward of micro-batch m (frees its activations)
  SendActivation,  // stage output of m to the next stage
  RecvActivation,  // stage input of m from the previous stage
  SendGrad,        // gradient of the stage input of m to the previous stage
  RecvGrad,        // gradient of the stage output of m from the next stage
  GradSync,        // gradients of the stage's replicas averaged (once, after every backward)
  OptimizerStep,   // the optimizer steps (once per global batch, after GradSync)
};
const char* action_type_name(ActionType type);

struct Action {
  ActionType type;
  int micro_batch = -1;  // -1 for GradSync and OptimizerStep
  bool operator==(const Action& o) const { return type == o.type && micro_batch == o.micro_batch; }
};
// "F3", "B3", "sendA3", "recvA3", "sendG3", "recvG3", "sync", "step".
std::string to_string(const Action& action);

struct Schedule {
  std::string name;
  int num_stages = 0;
  int num_micro_batches = 0;
  std::vector<std::vector<Action>> stages;  // stages[s]: the actions of stage s, in order
};

// Point-to-point actions are placed so that the schedule also runs when every send blocks until
// its receive is posted: after a backward, a stage first receives the next micro-batch's
// activation and only then sends the gradient back (the previous stage sends that activation
// before it waits for the gradient), so neighbours exchange in the same order.
Schedule gpipe_schedule(int num_stages, int micro_batches);
Schedule one_f_one_b_schedule(int num_stages, int micro_batches);
// "gpipe" or "1f1b"; anything else is a chorus::Error naming the two.
Schedule make_schedule(const std::string& name, int num_stages, int micro_batches);

// Unit costs for the simulated timeline (communication takes no time).
struct TimeModel {
  int forward_units = 1;
  int backward_units = 2;
};

struct ScheduleCheck {
  std::vector<std::string> errors;  // empty when the schedule is runnable
  bool deadlock = false;            // the simulation stopped with stages blocked (named in errors)
  std::vector<int> max_in_flight;   // per stage: most micro-batches forwarded and not yet backwarded
  // Per stage, per action: simulated start time (compute actions) or rendezvous time (p2p); -1 for
  // actions never reached.
  std::vector<std::vector<int>> start_time;
  int makespan = 0;  // time at which the last stage finished (when no deadlock)
  bool ok() const { return errors.empty(); }
};
ScheduleCheck check_schedule(const Schedule& schedule, TimeModel time = {});
// Throws chorus::Error listing the checker's errors (for the runtime: never start a bad schedule).
void require_valid(const Schedule& schedule);

// Every stage's action list, then the simulated timeline, one row per stage:
//   stage 0 | F0 F1 F2 F3 .. .. .. B0 B0 F4 B1 B1 ...
std::string to_string(const Schedule& schedule, TimeModel time = {});

}  // namespace chorus::distributed::pipeline
