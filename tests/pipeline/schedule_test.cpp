// The schedule generators and the checker: every generated GPipe and 1F1B schedule for up to 8
// stages and 16 micro-batches runs (no deadlock under blocking sends, every micro-batch forwarded
// and backwarded once per stage, dependencies in order) and holds the activations the papers say;
// hand-made broken schedules are rejected with the reason. Interleaved 1F1B (virtual stages) for
// up to 8 stages and 4 chunks runs under blocking sends, holds Megatron-LM's warm-up plus one chunk
// activations, and reaches the ideal makespan with asynchronous sends.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "distributed/pipeline/schedule.h"
#include "tensor/error.h"

using namespace chorus::distributed::pipeline;
using AT = ActionType;

namespace {

bool has_error(const ScheduleCheck& c, const std::string& part) {
  for (const auto& e : c.errors)
    if (e.find(part) != std::string::npos) return true;
  return false;
}

std::string all_errors(const ScheduleCheck& c) {
  std::string s;
  for (const auto& e : c.errors) s += e + "\n";
  return s;
}

int count(const std::vector<Action>& list, AT type) {
  return static_cast<int>(std::count_if(list.begin(), list.end(), [&](const Action& a) { return a.type == type; }));
}

}  // namespace

TEST_CASE("every generated schedule (S <= 8, M <= 16) runs, and 1F1B bounds activations by S - i", "[pipeline][schedule]") {
  for (int S = 1; S <= 8; ++S) {
    for (int M = 1; M <= 16; ++M) {
      INFO("S = " << S << ", M = " << M);
      const Schedule g = gpipe_schedule(S, M), f = one_f_one_b_schedule(S, M);
      const ScheduleCheck cg = check_schedule(g), cf = check_schedule(f);
      INFO(all_errors(cg) << all_errors(cf));
      REQUIRE(cg.ok());
      REQUIRE(cf.ok());
      REQUIRE(cf.max_in_flight.size() == static_cast<size_t>(S));
      for (int s = 0; s < S; ++s) {
        INFO("stage " << s);
        CHECK(cg.max_in_flight[s] == M);                    // GPipe holds every micro-batch
        CHECK(cf.max_in_flight[s] == std::min(S - s, M));   // early backward: at most S - i
        CHECK(count(f.stages[s], AT::Forward) == M);
        CHECK(count(f.stages[s], AT::Backward) == M);
        CHECK(count(f.stages[s], AT::SendActivation) == (s < S - 1 ? M : 0));
        CHECK(count(f.stages[s], AT::RecvGrad) == (s < S - 1 ? M : 0));
        CHECK(count(f.stages[s], AT::RecvActivation) == (s > 0 ? M : 0));
        CHECK(count(f.stages[s], AT::SendGrad) == (s > 0 ? M : 0));
        CHECK(f.stages[s].back() == Action{AT::OptimizerStep});
      }
      // Both take the same time in the simulation with F = 1, B = 2: (M + S - 1) * 3 units. The
      // win of 1F1B is memory, not the bubble (as the DAPPLE paper says).
      CHECK(cg.makespan == (M + S - 1) * 3);
      CHECK(cf.makespan == (M + S - 1) * 3);
    }
  }
}

TEST_CASE("1F1B stage i runs S - i - 1 warm-up forwards, then alternates", "[pipeline][schedule]") {
  const Schedule f = one_f_one_b_schedule(4, 8);
  auto compute = [&](int s) {
    std::string out;
    for (const Action& a : f.stages[s])
      if (a.type == AT::Forward || a.type == AT::Backward) out += to_string(a) + " ";
    return out;
  };
  CHECK(compute(0) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 ");
  CHECK(compute(2) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7 ");
  CHECK(compute(3) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 ");
  // After a backward, a middle stage receives the next activation before sending the gradient.
  std::vector<std::string> s1;
  for (const Action& a : f.stages[1]) s1.push_back(to_string(a));
  const auto b0 = std::find(s1.begin(), s1.end(), "B0");
  REQUIRE(b0 + 3 < s1.end());
  CHECK(*(b0 + 1) == "recvA3");
  CHECK(*(b0 + 2) == "sendG0");
  CHECK(*(b0 + 3) == "F3");
}

TEST_CASE("to_string prints every stage's actions and the timeline", "[pipeline][schedule]") {
  const std::string text = to_string(one_f_one_b_schedule(2, 3), {.forward_units = 1, .backward_units = 1});
  INFO(text);
  CHECK(text.find("stage 0: F0 sendA0 F1 sendA1 recvG0 B0") != std::string::npos);
  // Stage 1 idles one unit, then F0 B0 F1 B1 F2 B2; stage 0 fills two micro-batches first.
  CHECK(text.find("stage 0 | F0 F1 .  B0 F2 B1 .  B2") != std::string::npos);
  CHECK(text.find("stage 1 | .  F0 B0 F1 B1 F2 B2") != std::string::npos);
  CHECK(text.find("max in flight [2, 1]") != std::string::npos);
}

TEST_CASE("the checker reports a deadlock and names where each stage is stuck", "[pipeline][schedule]") {
  // The naive order (send the gradient back before receiving the next activation) deadlocks when
  // sends block: stage 0 waits to send activation 1 while stage 1 waits to send gradient 0.
  Schedule sch = one_f_one_b_schedule(2, 4);
  auto& s1 = sch.stages[1];
  for (size_t i = 0; i + 1 < s1.size(); ++i) {
    if (s1[i].type == AT::RecvActivation && s1[i + 1].type == AT::SendGrad) {
      std::swap(s1[i], s1[i + 1]);
      break;
    }
  }
  const ScheduleCheck c = check_schedule(sch);
  INFO(all_errors(c));
  CHECK(c.deadlock);
  CHECK(has_error(c, "stage 0 is stuck at action"));
  CHECK(has_error(c, "(sendA1) waiting for stage 1 to reach recvA1, but stage 1 is at action"));
  CHECK(has_error(c, "(sendG0)"));
  CHECK_THROWS_WITH(require_valid(sch), Catch::Contains("deadlock") && Catch::Contains("cannot run"));

  // Receiving in a different order than the neighbour sends also deadlocks (tags must match).
  Schedule swapped = gpipe_schedule(2, 2);
  auto& r = swapped.stages[1];
  std::swap(r[0], r[2]);  // recvA1 F0 recvA0 F1: waits for activation 1 while stage 0 sends 0
  const ScheduleCheck c2 = check_schedule(swapped);
  CHECK(c2.deadlock);
  CHECK(has_error(c2, "stage 1: Forward of micro-batch 0 (action 1) comes before its RecvActivation (action 2)"));
}

TEST_CASE("the checker rejects a backward before its forward, missing and repeated micro-batches", "[pipeline][schedule]") {
  {
    Schedule sch = gpipe_schedule(1, 2);  // F0 F1 B0 B1 sync step
    std::swap(sch.stages[0][1], sch.stages[0][2]);  // F0 B0 F1 B1: fine
    CHECK(check_schedule(sch).ok());
    std::swap(sch.stages[0][0], sch.stages[0][1]);  // B0 F0 F1 B1
    const ScheduleCheck c = check_schedule(sch);
    CHECK(has_error(c, "stage 0: Backward of micro-batch 0 (action 0) comes before its Forward (action 1)"));
  }
  {
    Schedule sch = gpipe_schedule(2, 3);
    auto& s0 = sch.stages[0];
    s0.erase(std::find(s0.begin(), s0.end(), Action{AT::Forward, 1}));
    const ScheduleCheck c = check_schedule(sch);
    CHECK(has_error(c, "stage 0: micro-batch 1 is missing its Forward"));
  }
  {
    Schedule sch = gpipe_schedule(2, 3);
    auto& s1 = sch.stages[1];
    // Stage 1 runs micro-batch 0 twice instead of 2.
    for (Action& a : s1)
      if (a.micro_batch == 2) a.micro_batch = 0;
    const ScheduleCheck c = check_schedule(sch);
    CHECK(has_error(c, "stage 1: micro-batch 0 is repeated: Forward"));
    CHECK(has_error(c, "stage 1: micro-batch 2 is missing its Backward"));
    CHECK(!c.ok());
  }
  {
    Schedule sch = one_f_one_b_schedule(3, 4);
    sch.stages[2][0].micro_batch = 7;
    CHECK(has_error(check_schedule(sch), "names micro-batch 7; expected 0 to 3"));
  }
}

TEST_CASE("the checker rejects misplaced GradSync / OptimizerStep and impossible neighbours", "[pipeline][schedule]") {
  {
    Schedule sch = one_f_one_b_schedule(2, 2);
    auto& s0 = sch.stages[0];
    s0.pop_back();  // no step
    std::rotate(s0.begin(), s0.end() - 1, s0.end());  // sync first
    const ScheduleCheck c = check_schedule(sch);
    CHECK(has_error(c, "stage 0: no OptimizerStep"));
    CHECK(has_error(c, "stage 0: GradSync (action 0) comes before the last Backward"));
  }
  {
    Schedule sch = one_f_one_b_schedule(2, 2);
    sch.stages[0].insert(sch.stages[0].begin(), Action{AT::RecvActivation, 0});
    const ScheduleCheck c = check_schedule(sch);
    CHECK(has_error(c, "stage 0: action 0 (recvA0) has no previous stage to talk to"));
    CHECK(c.deadlock);  // and the simulation cannot get past it
  }
  {
    Schedule sch = gpipe_schedule(2, 2);
    sch.stages.pop_back();
    CHECK(has_error(check_schedule(sch), "declares 2 stages, 1 chunk(s) each and 2 micro-batches but lists 1 stages"));
  }
  CHECK_THROWS_WITH(make_schedule("interleaved", 2, 2), Catch::Contains("'interleaved'") && Catch::Contains("\"1f1b\""));
  CHECK_THROWS_WITH(gpipe_schedule(0, 2), Catch::Contains("got 0 stages"));
}

TEST_CASE("random corruptions of valid schedules are rejected", "[pipeline][schedule]") {
  // Dropping any single action of a valid schedule must make it invalid (each one is needed).
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int S = 1 + static_cast<int>(rng() % 5), M = 1 + static_cast<int>(rng() % 6);
    Schedule sch = rng() % 2 ? gpipe_schedule(S, M) : one_f_one_b_schedule(S, M);
    auto& list = sch.stages[rng() % S];
    const size_t i = rng() % list.size();
    const Action dropped = list[i];
    list.erase(list.begin() + static_cast<long>(i));
    INFO(sch.name << " S " << S << " M " << M << " dropped " << to_string(dropped));
    CHECK(!check_schedule(sch).ok());
  }
}

TEST_CASE("interleaved 1F1B runs under blocking sends, holds its warm-up, and shrinks the bubble by the chunks",
          "[pipeline][schedule][interleaved]") {
  for (int S = 2; S <= 8; ++S) {
    for (int V = 2; V <= 4; ++V) {
      for (int M = S; M <= 16; M += S) {
        INFO("S " << S << " V " << V << " M " << M);
        const Schedule sch = interleaved_schedule(S, V, M);
        REQUIRE(sch.num_chunks == V);
        const ScheduleCheck c = check_schedule(sch);  // rendezvous: every send blocks until received
        INFO(all_errors(c));
        REQUIRE(c.ok());
        for (int s = 0; s < S; ++s) {
          // Every micro-batch on every chunk once each way; Megatron's warm-up + 1 chunks in flight.
          CHECK(count(sch.stages[s], AT::Forward) == M * V);
          CHECK(count(sch.stages[s], AT::Backward) == M * V);
          CHECK(c.max_in_flight[s] == std::min((S - s - 1) * 2 + (V - 1) * S + 1, M * V));
        }
        // With the runtime's asynchronous sends, the makespan is the ideal one: all the work of a
        // stage (3 units per micro-batch and chunk) plus a bubble of (S - 1) chunk-steps, V times
        // smaller than 1F1B's with the same work per stage (chunks of 1 + 2 units: a stage of V + 2V).
        const ScheduleCheck eager = check_schedule(sch, TimeModel{1, 2, true});
        const ScheduleCheck plain = check_schedule(one_f_one_b_schedule(S, M), TimeModel{V, 2 * V, true});
        CHECK(eager.makespan == 3 * V * M + 3 * (S - 1));
        CHECK(plain.makespan == 3 * V * M + 3 * V * (S - 1));
        CHECK(c.makespan >= eager.makespan);  // blocking sends can only wait longer
      }
    }
  }
}

TEST_CASE("interleaved 1F1B: the compute order, the printed chunks, and bad sizes", "[pipeline][schedule][interleaved]") {
  const Schedule sch = interleaved_schedule(2, 2, 4);
  std::vector<std::string> order;
  for (const Action& a : sch.stages[0])
    if (a.type == AT::Forward || a.type == AT::Backward) order.push_back(to_string(a));
  // Stage 0 of 2 with 2 chunks: 4 warm-up forwards round the chunks in groups of 2 micro-batches,
  // then one forward and one backward (backwards from the last chunk), then the rest.
  CHECK(order == std::vector<std::string>{"F0", "F1", "F0@1", "F1@1", "F2", "B0@1", "F3", "B1@1", "F2@1", "B0", "F3@1",
                                          "B1", "B2@1", "B3@1", "B2", "B3"});
  const std::string text = to_string(sch);
  CHECK(text.find("interleaved schedule: 2 stages x 2 chunks, 4 micro-batches") != std::string::npos);
  CHECK(text.find("recvA0@1") != std::string::npos);
  // The last stage's chunk 0 feeds the first stage's chunk 1 (virtual stage 1 -> 2).
  const auto& last = sch.stages[1];
  CHECK(std::find(last.begin(), last.end(), Action{AT::SendActivation, 0, 0}) != last.end());
  CHECK(std::find(sch.stages[0].begin(), sch.stages[0].end(), Action{AT::RecvActivation, 0, 1}) != sch.stages[0].end());
  CHECK_THROWS_WITH(interleaved_schedule(3, 2, 4), Catch::Contains("micro-batches a multiple of the stages"));
  CHECK_THROWS_WITH(interleaved_schedule(2, 1, 4), Catch::Contains("at least 2 chunks"));
  CHECK_THROWS_WITH(interleaved_schedule(1, 2, 4), Catch::Contains("at least 2 stages"));
  // A chunk out of range, and any single action dropped, are rejected.
  Schedule bad = sch;
  bad.stages[0][0].chunk = 2;
  CHECK(has_error(check_schedule(bad), "names chunk 2; expected 0 to 1"));
  std::mt19937 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    const int S = 2 + static_cast<int>(rng() % 3), V = 2 + static_cast<int>(rng() % 2);
    Schedule broken = interleaved_schedule(S, V, S * (1 + static_cast<int>(rng() % 2)));
    auto& list = broken.stages[rng() % S];
    const size_t i = rng() % list.size();
    const Action dropped = list[i];
    list.erase(list.begin() + static_cast<long>(i));
    INFO("S " << S << " V " << V << " dropped " << to_string(dropped));
    CHECK(!check_schedule(broken).ok());
  }
}
