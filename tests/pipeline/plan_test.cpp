// Pipeline plans: the planner's JSON schema read and written exactly, and every way a plan can be
// wrong refused with a message naming what was given and what was expected.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "distributed/pipeline/plan.h"
#include "tensor/error.h"

using namespace chorus::distributed::pipeline;
using Catch::Contains;

namespace {
const char* kPlannerPlan =
    R"({"version":1,"num_layers":8,"global_batch":32,"micro_batches":4,"schedule":"1f1b",)"
    R"("stages":[{"layers":[0,4],"ranks":[0,1]},{"layers":[4,8],"ranks":[2]}],)"
    R"("predicted":{"iteration_ms":12.5,"peak_memory_bytes":[100,200],"pivot_stage":1}})";

PipelinePlan two_stage() { return plan_from_json(kPlannerPlan); }
}  // namespace

TEST_CASE("a plan in the planner's schema is read, and written back in the same schema", "[pipeline][plan]") {
  PipelinePlan p = two_stage();
  CHECK(p.num_layers == 8);
  CHECK(p.global_batch == 32);
  CHECK(p.micro_batches == 4);
  CHECK(p.micro_batch_size() == 8);
  CHECK(p.schedule == "1f1b");
  REQUIRE(p.num_stages() == 2);
  CHECK(p.stages[0].first_layer == 0);
  CHECK(p.stages[0].end_layer == 4);
  CHECK(p.stages[0].ranks == std::vector<int>{0, 1});
  CHECK(p.stages[1].ranks == std::vector<int>{2});
  CHECK(p.stage_of(1) == 0);
  CHECK(p.stage_of(2) == 1);
  CHECK_THROWS_WITH(p.stage_of(3), Contains("rank 3 is in no stage"));
  p.validate(3);

  REQUIRE(p.predicted.has_value());
  CHECK(p.predicted->iteration_ms == 12.5);
  CHECK(p.predicted->peak_memory_bytes == std::vector<int64_t>{100, 200});
  CHECK(p.predicted->pivot_stage == 1);
  CHECK(p.str() == "[0,4) x2 on ranks 0,1 | [4,8) x1 on rank 2");

  // Written: the same keys and values, the planner's predictions included.
  nlohmann::json written = nlohmann::json::parse(plan_to_json(p));
  CHECK(written == nlohmann::json::parse(kPlannerPlan));
  // A plan without predictions is written without the key.
  PipelinePlan bare = p;
  bare.predicted.reset();
  CHECK_FALSE(nlohmann::json::parse(plan_to_json(bare)).contains("predicted"));
  // And through a file.
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/plan_test_plan.json";
  save_plan(p, path);
  PipelinePlan q = load_plan(path);
  CHECK(plan_to_json(q) == plan_to_json(p));
  CHECK_THROWS_WITH(load_plan(path + ".missing"), Contains("cannot open") && Contains(".missing"));
}

TEST_CASE("uniform_plan and even_cuts", "[pipeline][plan]") {
  CHECK(even_cuts(8, 2) == std::vector<int>{4});
  CHECK(even_cuts(7, 3) == std::vector<int>{2, 4});
  CHECK(even_cuts(5, 1).empty());
  CHECK_THROWS_WITH(even_cuts(3, 4), Contains("cannot cut 3 layers into 4 stages"));
  PipelinePlan p = uniform_plan(8, {3}, {2, 1}, 16, 4, "gpipe");
  REQUIRE(p.num_stages() == 2);
  CHECK(p.stages[0].end_layer == 3);
  CHECK(p.stages[1].first_layer == 3);
  CHECK(p.stages[0].ranks == std::vector<int>{0, 1});
  CHECK(p.stages[1].ranks == std::vector<int>{2});
  CHECK(p.schedule == "gpipe");
  CHECK_THROWS_WITH(uniform_plan(8, {3}, {1}, 16, 4, "gpipe"), Contains("2 stages but 1 replica counts"));
  // 16 / 4 = 4 rows per micro-batch cannot split among 3 replicas.
  CHECK_THROWS_WITH(uniform_plan(8, {3}, {3, 1}, 16, 4, "gpipe"),
                    Contains("micro-batch of 4 samples") && Contains("stage 0's 3 replicas"));
}

TEST_CASE("invalid plans are refused naming what was given and what was expected", "[pipeline][plan]") {
  auto with = [](const std::function<void(PipelinePlan&)>& edit) {
    PipelinePlan p = two_stage();
    edit(p);
    return p;
  };
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.stages[1].first_layer = 5; }).validate(3),
                    Contains("stage 1 starts at layer 5 but the previous stage ends at layer 4") && Contains("gaps"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.stages[1].first_layer = 3; }).validate(3),
                    Contains("starts at layer 3") && Contains("overlaps"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.stages[1].end_layer = 7; }).validate(3),
                    Contains("cover layers [0, 7) but the model has 8 layers"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.stages[1].end_layer = 9; }).validate(3),
                    Contains("layers [4, 9) but the model has 8 layers"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.stages[0].end_layer = 0; p.stages[1].first_layer = 0; }).validate(3),
                    Contains("stage 0 has layers [0, 0)"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.stages[1].ranks = {1}; }).validate(),
                    Contains("rank 1 is in stage 0 and again in stage 1"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.stages[1].ranks = {2, 2}; }).validate(),
                    Contains("rank 2 is in stage 1 and again in stage 1"));
  CHECK_THROWS_WITH(two_stage().validate(4),
                    Contains("hold 3 ranks but the world size is 4") && Contains("missing: [3]"));
  CHECK_THROWS_WITH(two_stage().validate(2), Contains("names rank 2; expected ranks in [0, 2)"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.stages[1].ranks.clear(); }).validate(),
                    Contains("stage 1 (layers [4, 8)) has no ranks"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.global_batch = 30; }).validate(3),
                    Contains("global_batch 30 does not split into 4 equal micro-batches"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.global_batch = 36; }).validate(3),
                    Contains("micro-batch of 9 samples") && Contains("stage 0's 2 replicas"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.micro_batches = 0; }).validate(3),
                    Contains("micro_batches is 0"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.schedule = "pipedream"; }).validate(3),
                    Contains("schedule 'pipedream' is unknown"));
  CHECK_THROWS_WITH(with([](PipelinePlan& p) { p.stages.clear(); }).validate(3), Contains("no stages"));
}

TEST_CASE("malformed plan JSON is refused with the offending key", "[pipeline][plan]") {
  nlohmann::json good = nlohmann::json::parse(kPlannerPlan);
  auto try_json = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return plan_from_json(j.dump());
  };
  CHECK_THROWS_WITH(plan_from_json("{not json"), Contains("plan: not valid JSON"));
  CHECK_THROWS_WITH(plan_from_json("[1,2]"), Contains("plan: got a JSON array, expected an object"));
  CHECK_THROWS_WITH(try_json([](auto& j) { j["version"] = 2; }), Contains("plan.version: got 2, expected 1"));
  CHECK_THROWS_WITH(try_json([](auto& j) { j.erase("global_batch"); }), Contains("plan: missing key \"global_batch\""));
  CHECK_THROWS_WITH(try_json([](auto& j) { j["micro_batches"] = "four"; }),
                    Contains("plan.micro_batches: got a JSON string (\"four\"), expected an integer"));
  CHECK_THROWS_WITH(try_json([](auto& j) { j["microbatches"] = 4; }), Contains("unknown key \"microbatches\""));
  CHECK_THROWS_WITH(try_json([](auto& j) { j["stages"][0]["layers"] = {0, 2, 4}; }),
                    Contains("plan.stages[0].layers: got 3 numbers, expected [first, end]"));
  CHECK_THROWS_WITH(try_json([](auto& j) { j["stages"][1]["replicas"] = 1; }),
                    Contains("plan.stages[1]: unknown key \"replicas\""));
  CHECK_THROWS_WITH(try_json([](auto& j) { j["stages"][1]["ranks"] = "2"; }), Contains("plan.stages[1].ranks: got a JSON string, expected an array"));
  // Numbers outside int's range are refused, not truncated or cast (the fuzzer found a rank of
  // 3.3e72: undefined behaviour in the cast; 4294967297 would have been read as rank 1).
  CHECK_THROWS_WITH(try_json([](auto& j) { j["stages"][1]["ranks"] = {3.3e72}; }),
                    Contains("plan.stages[1].ranks[0]: got 3.3e+72, expected an integer"));
  CHECK_THROWS_WITH(try_json([](auto& j) { j["stages"][1]["ranks"] = {4294967297LL}; }),
                    Contains("plan.stages[1].ranks[0]: got 4294967297, expected an integer in [0, "));
  CHECK_THROWS_WITH(try_json([](auto& j) { j["num_layers"] = 1.5; }), Contains("plan.num_layers: got 1.5, expected an integer"));
  // A rank far beyond the others: refused at once, naming the first missing ranks (the fuzzer's
  // input; the check listed every missing rank and took seconds).
  CHECK_THROWS_WITH(try_json([](auto& j) { j["stages"][1]["ranks"] = {21111111}; }),
                    Contains("the stages hold 3 ranks but the world size is 21111112") &&
                        Contains("missing: [2, 3, 4, 5, 6, 7, 8, 9], ..."));
  // Structural rules apply on read too, with the ranks the plan names as its world.
  CHECK_THROWS_WITH(try_json([](auto& j) { j["stages"][1]["layers"] = {5, 8}; }), Contains("gaps"));
}

// Interleaved plans list virtual stages whose ranks repeat every P stages.
TEST_CASE("interleaved plans: virtual stages on repeating ranks, and what is refused", "[pipeline][plan][interleaved]") {
  const std::string text =
      R"({"version":1,"num_layers":8,"global_batch":8,"micro_batches":4,"schedule":"interleaved","stages":[)"
      R"({"layers":[0,2],"ranks":[0]},{"layers":[2,4],"ranks":[1,2]},{"layers":[4,6],"ranks":[0]},)"
      R"({"layers":[6,8],"ranks":[1,2]}]})";
  const PipelinePlan p = plan_from_json(text);
  CHECK(p.num_positions() == 2);
  CHECK(p.chunks() == 2);
  CHECK(p.stage_of(2) == 1);
  CHECK_NOTHROW(p.validate(3));
  auto with = [&](const std::function<void(PipelinePlan&)>& edit) {
    PipelinePlan q = p;
    edit(q);
    return q;
  };
  CHECK_THROWS_WITH(with([](PipelinePlan& q) { q.stages[3].ranks = {2, 1}; }).validate(3),
                    Contains("interleaved stage 3 has ranks [2, 1] but stage 1 (the same position) has [1, 2]"));
  CHECK_THROWS_WITH(with([](PipelinePlan& q) { q.micro_batches = 2 * 1 + 1; q.global_batch = 6; }).validate(3),
                    Contains("needs micro_batches a multiple of 2; got 3"));
  CHECK_THROWS_WITH(with([](PipelinePlan& q) { q.stages[2].ranks = {3}; q.stages[3].ranks = {4}; }).validate(5),
                    Contains("ranks repeat every 4 stages"));
  // Not interleaved, a rank in two stages is still an error.
  CHECK_THROWS_WITH(with([](PipelinePlan& q) { q.schedule = "1f1b"; }).validate(3), Contains("rank 0 is in stage 0 and again in stage 2"));
}
