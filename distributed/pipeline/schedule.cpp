#include "distributed/pipeline/schedule.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>

#include "tensor/error.h"

namespace chorus::distributed::pipeline {

const char* action_type_name(ActionType type) {
  switch (type) {
    case ActionType::Forward: return "Forward";
    case ActionType::Backward: return "Backward";
    case ActionType::SendActivation: return "SendActivation";
    case ActionType::RecvActivation: return "RecvActivation";
    case ActionType::SendGrad: return "SendGrad";
    case ActionType::RecvGrad: return "RecvGrad";
    case ActionType::GradSync: return "GradSync";
    case ActionType::OptimizerStep: return "OptimizerStep";
  }
  return "?";
}

std::string to_string(const Action& a) {
  const std::string chunk = a.chunk != 0 ? fmt::format("@{}", a.chunk) : "";
  switch (a.type) {
    case ActionType::Forward: return fmt::format("F{}{}", a.micro_batch, chunk);
    case ActionType::Backward: return fmt::format("B{}{}", a.micro_batch, chunk);
    case ActionType::SendActivation: return fmt::format("sendA{}{}", a.micro_batch, chunk);
    case ActionType::RecvActivation: return fmt::format("recvA{}{}", a.micro_batch, chunk);
    case ActionType::SendGrad: return fmt::format("sendG{}{}", a.micro_batch, chunk);
    case ActionType::RecvGrad: return fmt::format("recvG{}{}", a.micro_batch, chunk);
    case ActionType::GradSync: return "sync";
    case ActionType::OptimizerStep: return "step";
  }
  return "?";
}

namespace {

void check_sizes(const char* what, int num_stages, int micro_batches) {
  if (num_stages < 1 || micro_batches < 1) {
    fail("pipeline {} schedule: got {} stages and {} micro-batches; expected at least 1 of each", what, num_stages,
         micro_batches);
  }
}

// Adds the point-to-point actions around each compute action of stage s (see schedule.h for why a
// backward's gradient is sent after the next forward's activation is received).
std::vector<Action> with_communication(int s, int num_stages, const std::vector<Action>& compute) {
  const bool first = s == 0, last = s == num_stages - 1;
  std::vector<Action> out;
  int received_ahead = -1;  // the micro-batch whose activation was received before its forward's turn
  for (size_t k = 0; k < compute.size(); ++k) {
    const Action& a = compute[k];
    const int m = a.micro_batch;
    if (a.type == ActionType::Forward) {
      if (!first && received_ahead != m) out.push_back({ActionType::RecvActivation, m});
      out.push_back(a);
      if (!last) out.push_back({ActionType::SendActivation, m});
    } else {
      if (!last) out.push_back({ActionType::RecvGrad, m});
      out.push_back(a);
      if (!first) {
        if (k + 1 < compute.size() && compute[k + 1].type == ActionType::Forward) {
          received_ahead = compute[k + 1].micro_batch;
          out.push_back({ActionType::RecvActivation, received_ahead});
        }
        out.push_back({ActionType::SendGrad, m});
      }
    }
  }
  out.push_back({ActionType::GradSync});
  out.push_back({ActionType::OptimizerStep});
  return out;
}

}  // namespace

Schedule gpipe_schedule(int num_stages, int micro_batches) {
  check_sizes("gpipe", num_stages, micro_batches);
  Schedule sch{"gpipe", num_stages, micro_batches, {}};
  for (int s = 0; s < num_stages; ++s) {
    std::vector<Action> compute;
    for (int m = 0; m < micro_batches; ++m) compute.push_back({ActionType::Forward, m});
    for (int m = 0; m < micro_batches; ++m) compute.push_back({ActionType::Backward, m});
    sch.stages.push_back(with_communication(s, num_stages, compute));
  }
  return sch;
}

Schedule one_f_one_b_schedule(int num_stages, int micro_batches) {
  check_sizes("1f1b", num_stages, micro_batches);
  Schedule sch{"1f1b", num_stages, micro_batches, {}};
  for (int s = 0; s < num_stages; ++s) {
    // Warm-up: S - s - 1 forwards fill the pipeline below this stage; then one forward and one
    // backward alternate (the forward admits the (S - s)-th micro-batch in flight, the backward
    // retires the oldest); the cool-down drains the remaining backwards.
    const int warmup = std::min(num_stages - s - 1, micro_batches);
    std::vector<Action> compute;
    int next_forward = 0, next_backward = 0;
    for (; next_forward < warmup; ++next_forward) compute.push_back({ActionType::Forward, next_forward});
    while (next_forward < micro_batches) {
      compute.push_back({ActionType::Forward, next_forward++});
      compute.push_back({ActionType::Backward, next_backward++});
    }
    while (next_backward < micro_batches) compute.push_back({ActionType::Backward, next_backward++});
    sch.stages.push_back(with_communication(s, num_stages, compute));
  }
  return sch;
}

Schedule interleaved_schedule(int num_stages, int chunks, int micro_batches) {
  check_sizes("interleaved", num_stages, micro_batches);
  const int S = num_stages, V = chunks, M = micro_batches, K = S * V, total = M * V;
  if (S < 2 || V < 2 || M % S != 0) {
    fail("pipeline interleaved schedule: got {} stages, {} chunks and {} micro-batches; expected at least 2 stages, at "
         "least 2 chunks, and micro-batches a multiple of the stages",
         S, V, M);
  }
  // Compute order per stage (Megatron-LM): the f-th forward is micro-batch (f / (S V)) S + f % S on
  // chunk (f / S) % V; backwards the same with the chunks in reverse; warm-up, then one forward and
  // one backward alternate, then the remaining backwards.
  auto forward_at = [&](int f) { return Action{ActionType::Forward, (f / K) * S + f % S, (f / S) % V}; };
  auto backward_at = [&](int b) { return Action{ActionType::Backward, (b / K) * S + b % S, V - 1 - (b / S) % V}; };
  std::vector<std::vector<Action>> compute(S);
  for (int s = 0; s < S; ++s) {
    const int warmup = std::min((S - s - 1) * 2 + (V - 1) * S, total);
    int f = 0, b = 0;
    for (; f < warmup; ++f) compute[s].push_back(forward_at(f));
    while (f < total) {
      compute[s].push_back(forward_at(f++));
      compute[s].push_back(backward_at(b++));
    }
    while (b < total) compute[s].push_back(backward_at(b++));
  }
  // Eager simulation (a send never waits): when each compute starts and ends, in units of 1
  // (forward) and 2 (backward). done[kind][k][m]: when virtual stage k finished F or B of m.
  const TimeModel time;
  std::vector<std::vector<std::vector<int>>> done(2, std::vector<std::vector<int>>(K, std::vector<int>(M, -1)));
  std::vector<std::vector<int>> start(S), finish(S);
  std::vector<size_t> next(S, 0);
  std::vector<int> clock(S, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < S; ++s) {
      while (next[s] < compute[s].size()) {
        const Action& a = compute[s][next[s]];
        const int k = a.chunk * S + s;
        const bool fwd = a.type == ActionType::Forward;
        int ready = 0;
        if (fwd && k > 0) ready = done[0][k - 1][a.micro_batch];
        if (!fwd && k + 1 < K) ready = done[1][k + 1][a.micro_batch];
        if (ready < 0) break;  // its input is not produced yet
        const int t0 = std::max(clock[s], ready);
        clock[s] = t0 + (fwd ? time.forward_units : time.backward_units);
        start[s].push_back(t0);
        finish[s].push_back(clock[s]);
        done[fwd ? 0 : 1][k][a.micro_batch] = clock[s];
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < S; ++s) {
    if (next[s] != compute[s].size()) fail("pipeline interleaved schedule: the compute order of stage {} cannot run", s);
  }
  // Every transfer, in one global order (time, then kind, virtual stage, micro-batch); each stage's
  // list takes its computes and its ends of the transfers by time, transfers before a compute that
  // starts at the same time, transfers among themselves in the global order.
  struct Event {
    int time, cls;  // cls 0: a transfer, 1: a compute
    long long order;
    Action action;
  };
  std::vector<std::vector<Event>> events(S);
  for (int s = 0; s < S; ++s) {
    for (size_t i = 0; i < compute[s].size(); ++i) events[s].push_back({start[s][i], 1, static_cast<long long>(i), compute[s][i]});
  }
  for (int kind = 0; kind < 2; ++kind) {
    for (int k = 0; k < K; ++k) {
      const int to = kind == 0 ? k + 1 : k - 1;
      if (to < 0 || to >= K) continue;
      for (int m = 0; m < M; ++m) {
        const int t = done[kind][k][m];
        const long long order = ((static_cast<long long>(t) * 2 + kind) * K + k) * M + m;
        const ActionType send = kind == 0 ? ActionType::SendActivation : ActionType::SendGrad;
        const ActionType recv = kind == 0 ? ActionType::RecvActivation : ActionType::RecvGrad;
        events[k % S].push_back({t, 0, order, {send, m, k / S}});
        events[to % S].push_back({t, 0, order, {recv, m, to / S}});
      }
    }
  }
  Schedule sch{"interleaved", S, M, {}, V};
  for (int s = 0; s < S; ++s) {
    std::stable_sort(events[s].begin(), events[s].end(), [](const Event& a, const Event& b) {
      if (a.time != b.time) return a.time < b.time;
      if (a.cls != b.cls) return a.cls < b.cls;
      return a.order < b.order;
    });
    std::vector<Action> list;
    for (const Event& e : events[s]) list.push_back(e.action);
    list.push_back({ActionType::GradSync});
    list.push_back({ActionType::OptimizerStep});
    sch.stages.push_back(std::move(list));
  }
  return sch;
}

Schedule make_schedule(const std::string& name, int num_stages, int micro_batches) {
  if (name == "gpipe") return gpipe_schedule(num_stages, micro_batches);
  if (name == "1f1b") return one_f_one_b_schedule(num_stages, micro_batches);
  fail("pipeline: unknown schedule '{}'; expected \"gpipe\" or \"1f1b\"", name);
}

namespace {

bool per_micro_batch(ActionType t) { return t != ActionType::GradSync && t != ActionType::OptimizerStep; }

// The neighbour a point-to-point action talks to, and the action it must be at to match: the next
// or previous virtual stage ([Virtual stages]); a stage index of -1 or num_stages where there is none.
struct Partner {
  int stage;
  Action action;
};
std::optional<Partner> partner_of(const Schedule& sch, int s, const Action& a) {
  const int S = sch.num_stages, K = S * sch.num_chunks, k = a.chunk * S + s;
  auto at = [&](int other, ActionType type) {
    if (other < 0) return Partner{-1, {type, a.micro_batch, 0}};
    if (other >= K) return Partner{S, {type, a.micro_batch, 0}};
    return Partner{other % S, {type, a.micro_batch, other / S}};
  };
  switch (a.type) {
    case ActionType::SendActivation: return at(k + 1, ActionType::RecvActivation);
    case ActionType::RecvActivation: return at(k - 1, ActionType::SendActivation);
    case ActionType::SendGrad: return at(k - 1, ActionType::RecvGrad);
    case ActionType::RecvGrad: return at(k + 1, ActionType::SendGrad);
    default: return std::nullopt;
  }
}

// Order and count rules one stage's list must satisfy on its own.
void check_stage_list(const Schedule& sch, int s, std::vector<std::string>& errors) {
  const std::vector<Action>& list = sch.stages[s];
  const int S = sch.num_stages, M = sch.num_micro_batches, V = sch.num_chunks;
  // Whether chunk c of this stage is the first or the last virtual stage.
  auto first_at = [&](int c) { return c == 0 && s == 0; };
  auto last_at = [&](int c) { return c == V - 1 && s == S - 1; };
  auto named = [&](int m, int c) { return V > 1 ? fmt::format("{} (chunk {})", m, c) : std::to_string(m); };
  // position[type][c * M + m]: index of the action in the list (-1: absent).
  std::map<ActionType, std::vector<int>> position;
  for (ActionType t : {ActionType::Forward, ActionType::Backward, ActionType::SendActivation,
                       ActionType::RecvActivation, ActionType::SendGrad, ActionType::RecvGrad}) {
    position[t].assign(static_cast<size_t>(M) * V, -1);
  }
  int sync_at = -1, step_at = -1, last_backward_at = -1;
  for (int i = 0; i < static_cast<int>(list.size()); ++i) {
    const Action& a = list[i];
    if (!per_micro_batch(a.type)) {
      int& at = a.type == ActionType::GradSync ? sync_at : step_at;
      if (at >= 0) errors.push_back(fmt::format("stage {}: {} appears twice (actions {} and {})", s, action_type_name(a.type), at, i));
      at = i;
      continue;
    }
    if (a.micro_batch < 0 || a.micro_batch >= M) {
      errors.push_back(fmt::format("stage {}: action {} ({}) names micro-batch {}; expected 0 to {}", s, i,
                                   action_type_name(a.type), a.micro_batch, M - 1));
      continue;
    }
    if (a.chunk < 0 || a.chunk >= V) {
      errors.push_back(fmt::format("stage {}: action {} ({}) names chunk {}; expected 0 to {}", s, i,
                                   action_type_name(a.type), a.chunk, V - 1));
      continue;
    }
    const bool towards_previous = a.type == ActionType::RecvActivation || a.type == ActionType::SendGrad;
    if ((first_at(a.chunk) && towards_previous) || (last_at(a.chunk) && !towards_previous &&
                                                    (a.type == ActionType::SendActivation || a.type == ActionType::RecvGrad))) {
      errors.push_back(fmt::format("stage {}: action {} ({}) has no {} stage to talk to", s, i, to_string(a),
                                   towards_previous ? "previous" : "next"));
      continue;
    }
    int& at = position[a.type][static_cast<size_t>(a.chunk) * M + a.micro_batch];
    if (at >= 0) {
      errors.push_back(fmt::format("stage {}: micro-batch {} is repeated: {} at actions {} and {}", s,
                                   named(a.micro_batch, a.chunk), action_type_name(a.type), at, i));
      continue;
    }
    at = i;
    if (a.type == ActionType::Backward) last_backward_at = i;
  }
  auto need = [&](ActionType t, int m, int c, bool required) {
    if (required && position[t][static_cast<size_t>(c) * M + m] < 0) {
      errors.push_back(fmt::format("stage {}: micro-batch {} is missing its {}", s, named(m, c), action_type_name(t)));
    }
  };
  auto before = [&](ActionType a, ActionType b, int m, int c) {
    const int pa = position[a][static_cast<size_t>(c) * M + m], pb = position[b][static_cast<size_t>(c) * M + m];
    if (pa >= 0 && pb >= 0 && pa > pb) {
      errors.push_back(fmt::format("stage {}: {} of micro-batch {} (action {}) comes before its {} (action {})", s,
                                   action_type_name(b), named(m, c), pb, action_type_name(a), pa));
    }
  };
  for (int c = 0; c < V; ++c) {
    for (int m = 0; m < M; ++m) {
      need(ActionType::Forward, m, c, true);
      need(ActionType::Backward, m, c, true);
      need(ActionType::RecvActivation, m, c, !first_at(c));
      need(ActionType::SendGrad, m, c, !first_at(c));
      need(ActionType::SendActivation, m, c, !last_at(c));
      need(ActionType::RecvGrad, m, c, !last_at(c));
      before(ActionType::Forward, ActionType::Backward, m, c);  // a forward missing before its backward
      before(ActionType::RecvActivation, ActionType::Forward, m, c);
      before(ActionType::Forward, ActionType::SendActivation, m, c);
      before(ActionType::RecvGrad, ActionType::Backward, m, c);
      before(ActionType::Backward, ActionType::SendGrad, m, c);
    }
  }
  if (sync_at < 0) errors.push_back(fmt::format("stage {}: no GradSync", s));
  if (step_at < 0) errors.push_back(fmt::format("stage {}: no OptimizerStep", s));
  if (sync_at >= 0 && sync_at < last_backward_at) {
    errors.push_back(fmt::format("stage {}: GradSync (action {}) comes before the last Backward (action {})", s, sync_at,
                                 last_backward_at));
  }
  if (sync_at >= 0 && step_at >= 0 && step_at < sync_at) {
    errors.push_back(fmt::format("stage {}: OptimizerStep (action {}) comes before GradSync (action {})", s, step_at, sync_at));
  }
}

}  // namespace

ScheduleCheck check_schedule(const Schedule& sch, TimeModel time) {
  ScheduleCheck out;
  const int S = sch.num_stages;
  if (S < 1 || sch.num_micro_batches < 1 || sch.num_chunks < 1 || static_cast<int>(sch.stages.size()) != S) {
    out.errors.push_back(fmt::format("schedule '{}' declares {} stages, {} chunk(s) each and {} micro-batches but lists {} "
                                     "stages",
                                     sch.name, sch.num_stages, sch.num_chunks, sch.num_micro_batches, sch.stages.size()));
    return out;
  }
  const int M = sch.num_micro_batches, V = sch.num_chunks;
  for (int s = 0; s < S; ++s) check_stage_list(sch, s, out.errors);

  // Simulation: each stage executes its list in order; compute actions take their units;
  // point-to-point actions wait until the neighbour is at the matching action (rendezvous).
  std::vector<size_t> pc(S, 0);
  std::vector<int> clock(S, 0), in_flight(S, 0);
  std::vector<std::vector<bool>> forwarded(S, std::vector<bool>(static_cast<size_t>(M) * V, false));
  out.max_in_flight.assign(S, 0);
  out.start_time.resize(S);
  for (int s = 0; s < S; ++s) out.start_time[s].assign(sch.stages[s].size(), -1);
  auto done = [&](int s) { return pc[s] >= sch.stages[s].size(); };
  std::map<std::string, int> sent;  // eager_sends: when each send ran, by "from>to:receive action"
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < S; ++s) {
      while (!done(s)) {
        const Action& a = sch.stages[s][pc[s]];
        auto partner = partner_of(sch, s, a);
        if (!partner) {
          out.start_time[s][pc[s]] = clock[s];
          const int m = a.micro_batch;
          const bool valid_m = m >= 0 && m < M && a.chunk >= 0 && a.chunk < V;
          const size_t slot = valid_m ? static_cast<size_t>(a.chunk) * M + m : 0;
          if (a.type == ActionType::Forward) {
            clock[s] += time.forward_units;
            if (valid_m && !forwarded[s][slot]) {
              forwarded[s][slot] = true;
              out.max_in_flight[s] = std::max(out.max_in_flight[s], ++in_flight[s]);
            }
          } else if (a.type == ActionType::Backward) {
            clock[s] += time.backward_units;
            if (valid_m && forwarded[s][slot]) {
              forwarded[s][slot] = false;
              --in_flight[s];
            }
          }
          ++pc[s];
          progress = true;
          continue;
        }
        const int p = partner->stage;
        if (time.eager_sends && p >= 0 && p < S) {
          // A send completes at once (its time is recorded); a receive waits for its send's time.
          const bool is_send = a.type == ActionType::SendActivation || a.type == ActionType::SendGrad;
          const std::string key = is_send ? fmt::format("{}>{}:{}", s, p, to_string(partner->action))
                                          : fmt::format("{}>{}:{}", p, s, to_string(a));
          if (is_send) {
            sent[key] = clock[s];
          } else {
            auto it = sent.find(key);
            if (it == sent.end()) break;
            clock[s] = std::max(clock[s], it->second);
          }
          out.start_time[s][pc[s]] = clock[s];
          ++pc[s];
          progress = true;
          continue;
        }
        if (p < 0 || p >= S || done(p) || !(sch.stages[p][pc[p]] == partner->action)) break;
        const int t = std::max(clock[s], clock[p]);
        clock[s] = clock[p] = t;
        out.start_time[s][pc[s]] = out.start_time[p][pc[p]] = t;
        ++pc[s];
        ++pc[p];
        progress = true;
      }
    }
  }
  std::vector<std::string> stuck;
  for (int s = 0; s < S; ++s) {
    if (done(s)) continue;
    const Action& a = sch.stages[s][pc[s]];
    const Partner p = *partner_of(sch, s, a);
    std::string other;
    if (p.stage < 0 || p.stage >= S) other = fmt::format("there is no stage {}", p.stage);
    else if (done(p.stage)) other = fmt::format("stage {} has finished its list", p.stage);
    else other = fmt::format("stage {} is at action {} ({})", p.stage, pc[p.stage], to_string(sch.stages[p.stage][pc[p.stage]]));
    stuck.push_back(fmt::format("stage {} is stuck at action {} ({}) waiting for stage {} to reach {}, but {}", s, pc[s],
                                to_string(a), p.stage, to_string(p.action), other));
  }
  if (!stuck.empty()) {
    out.deadlock = true;
    out.errors.push_back(fmt::format("deadlock: {}", fmt::join(stuck, "; ")));
  } else {
    out.makespan = *std::max_element(clock.begin(), clock.end());
  }
  return out;
}

void require_valid(const Schedule& schedule) {
  ScheduleCheck c = check_schedule(schedule);
  if (!c.ok()) {
    fail("pipeline schedule '{}' ({} stages, {} micro-batches) cannot run: {}", schedule.name, schedule.num_stages,
         schedule.num_micro_batches, fmt::join(c.errors, "; "));
  }
}

std::string to_string(const Schedule& sch, TimeModel time) {
  std::string out = fmt::format("{} schedule: {} stages{}, {} micro-batches\n", sch.name, sch.num_stages,
                                sch.num_chunks > 1 ? fmt::format(" x {} chunks", sch.num_chunks) : "",
                                sch.num_micro_batches);
  for (size_t s = 0; s < sch.stages.size(); ++s) {
    std::vector<std::string> names;
    for (const Action& a : sch.stages[s]) names.push_back(to_string(a));
    out += fmt::format("stage {}: {}\n", s, fmt::join(names, " "));
  }
  ScheduleCheck c = check_schedule(sch, time);
  if (!c.ok()) {
    out += fmt::format("no timeline: {}\n", fmt::join(c.errors, "; "));
    return out;
  }
  out += fmt::format("timeline (forward {} unit(s), backward {}; communication instant; max in flight {}):\n",
                     time.forward_units, time.backward_units, c.max_in_flight);
  const int width = (sch.num_micro_batches > 10 ? 4 : 3) + (sch.num_chunks > 1 ? 2 : 0);  // "F12@1 "
  for (size_t s = 0; s < sch.stages.size(); ++s) {
    std::vector<std::string> cells(c.makespan, std::string(width, ' '));
    for (auto& cell : cells) cell[0] = '.';
    for (size_t i = 0; i < sch.stages[s].size(); ++i) {
      const Action& a = sch.stages[s][i];
      if (a.type != ActionType::Forward && a.type != ActionType::Backward) continue;
      const int units = a.type == ActionType::Forward ? time.forward_units : time.backward_units;
      std::string label = to_string(a);
      label.resize(width, ' ');
      for (int u = 0; u < units; ++u) cells[c.start_time[s][i] + u] = label;
    }
    std::string row;
    for (const auto& cell : cells) row += cell;
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += fmt::format("stage {} | {}\n", s, row);
  }
  return out;
}

}  // namespace chorus::distributed::pipeline
