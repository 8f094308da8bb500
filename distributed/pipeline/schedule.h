// Pipeline schedules as data: for each stage, the ordered list of actions its ranks perform in one
// training step (every replica of a stage runs the same list). Three generators — GPipe (all
// forwards, then all backwards), 1F1B / DAPPLE's early backward (stage i admits at most S - i
// micro-batches before its first backward, then alternates one forward and one backward) and
// interleaved 1F1B (Megatron-LM's virtual stages: each stage holds V chunks of the model) — and a
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
  int chunk = 0;         // interleaved schedules: which of the stage's model chunks (virtual stages)
  bool operator==(const Action& o) const {
    return type == o.type && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};
// "F3", "B3", "sendA3", "recvA3", "sendG3", "recvG3", "sync", "step"; chunk c > 0 appends "@c".
std::string to_string(const Action& action);

struct Schedule {
  std::string name;
  int num_stages = 0;
  int num_micro_batches = 0;
  std::vector<std::vector<Action>> stages;  // stages[s]: the actions of stage s, in order
  // [Virtual stages] Model chunks per stage (interleaved schedules; 1 otherwise). Chunk c of stage s
  // is virtual stage c * num_stages + s of num_stages * num_chunks: activations flow from virtual
  // stage k to k + 1, so from the last stage's chunk c to the first stage's chunk c + 1.
  int num_chunks = 1;
};

// Point-to-point actions are placed so that the schedule also runs when every send blocks until
// its receive is posted: after a backward, a stage first receives the next micro-batch's
// activation and only then sends the gradient back (the previous stage sends that activation
// before it waits for the gradient), so neighbours exchange in the same order.
Schedule gpipe_schedule(int num_stages, int micro_batches);
Schedule one_f_one_b_schedule(int num_stages, int micro_batches);
// Megatron-LM's interleaved 1F1B with `chunks` virtual stages per stage (Narayanan et al., SC 2021):
// forwards and backwards go round the chunks in groups of num_stages micro-batches, stage s runs
// (S - s - 1) x 2 + (V - 1) x S warm-up forwards, then alternates. The bubble shrinks by V: with
// forward and backward of a whole stage taking f and b, (S - 1)(f + b) / V instead of (S - 1)(f + b).
// Communication is placed in one global order of the transfers (by their time in an eager
// simulation), so the lists also run when every send blocks until its receive is posted.
// micro_batches must be a multiple of num_stages; num_stages >= 2, chunks >= 2.
// The runtime (pipeline.h) does not run interleaved schedules yet: plans cannot name one.
Schedule interleaved_schedule(int num_stages, int chunks, int micro_batches);
// "gpipe" or "1f1b"; anything else is a chorus::Error naming the two.
Schedule make_schedule(const std::string& name, int num_stages, int micro_batches);

// Unit costs for the simulated timeline (communication takes no time).
struct TimeModel {
  int forward_units = 1;
  int backward_units = 2;
  // false: a send waits until its receive is posted (rendezvous: what every schedule must survive,
  // and how the checker proves it deadlock-free); true: a send completes at once and only receives
  // wait (the runtime's asynchronous sends on the CPU), for the timeline and makespan only.
  bool eager_sends = false;
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
