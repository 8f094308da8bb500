// The planner's JSON files: profile, cluster and plan survive a round trip unchanged, and a file
// with an unknown key, a missing key or a value of the wrong type is a chorus::Error that names the
// key, what was given and what was expected.
#include <catch2/catch.hpp>
#include <cstdio>

#include "distributed/pipeline/planner/cluster.h"
#include "distributed/pipeline/plan.h"
#include "distributed/pipeline/planner/profile.h"
#include "tensor/error.h"

using namespace chorus;
using namespace chorus::distributed::pipeline;
using namespace chorus::distributed::pipeline::planner;

TEST_CASE("profile JSON round trip keeps every field", "[planner][json]") {
  ModelProfile p;
  p.batch = 8;
  p.model = "mlp 784-1024-10";
  p.layers = {{"0", 1.25, 2.5, 32768, 3215360, 65536}, {"1", 0.1, 0.3333333333333333, 40, 10250, -1}};
  const ModelProfile q = profile_from_json(profile_to_json(p));
  REQUIRE(q.batch == 8);
  REQUIRE(q.model == p.model);
  REQUIRE(q.layers.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(q.layers[i].name == p.layers[i].name);
    REQUIRE(q.layers[i].forward_ms == p.layers[i].forward_ms);  // exact: nlohmann writes round-trip digits
    REQUIRE(q.layers[i].backward_ms == p.layers[i].backward_ms);
    REQUIRE(q.layers[i].activation_bytes == p.layers[i].activation_bytes);
    REQUIRE(q.layers[i].param_bytes == p.layers[i].param_bytes);
    REQUIRE(q.layers[i].saved_bytes == p.layers[i].saved_bytes);
  }
  REQUIRE(q.layers[1].saved_or_activation_bytes() == 40);
  // Through a file too.
  const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/p.json";
  save_profile(p, path);
  REQUIRE(load_profile(path).layers[0].param_bytes == 3215360);
}

TEST_CASE("cluster JSON round trip and flags-style values", "[planner][json]") {
  const Cluster c = cluster_from_json(
      R"({"nodes": 2, "devices_per_node": 8, "intra_node_bytes_per_s": 150e9, "inter_node_bytes_per_s": 3.125e9,
          "memory_bytes_per_device": 32e9, "inter_node_latency_us": 10})");
  REQUIRE(c.num_devices() == 16);
  REQUIRE(c.memory_bytes_per_device == 32000000000);
  REQUIRE(c.inter_node_latency_us == 10);
  REQUIRE(c.intra_node_latency_us == 0);
  REQUIRE(c.node_of(9) == 1);
  const Cluster d = cluster_from_json(cluster_to_json(c));
  REQUIRE(d.intra_node_bytes_per_s == c.intra_node_bytes_per_s);
  REQUIRE(d.inter_node_bytes_per_s == c.inter_node_bytes_per_s);
  REQUIRE(d.devices_per_node == 8);
}

TEST_CASE("plan JSON has the runtime's schema and round-trips", "[planner][json]") {
  const std::string text =
      R"({"version":1,"num_layers":8,"global_batch":32,"micro_batches":4,"schedule":"1f1b",)"
      R"("stages":[{"layers":[0,4],"ranks":[0,1]},{"layers":[4,8],"ranks":[2]}],)"
      R"("predicted":{"iteration_ms":12.5,"peak_memory_bytes":[1000,800],"pivot_stage":1}})";
  const PipelinePlan p = plan_from_json(text);
  REQUIRE(p.num_stages() == 2);
  REQUIRE(p.stages[0].ranks == std::vector<int>{0, 1});
  REQUIRE(p.stages[1].first_layer == 4);
  REQUIRE(p.predicted->pivot_stage == 1);
  REQUIRE(plan_to_json(p) == text + "\n");  // same keys, same order, same numbers
  REQUIRE(p.str() == "[0,4) x2 on ranks 0,1 | [4,8) x1 on rank 2");
}

TEST_CASE("bad JSON names the key, what was given and what was expected", "[planner][json][errors]") {
  const std::string layer = R"({"name":"a","forward_ms":1,"backward_ms":2,"activation_bytes":3,"param_bytes":4})";
  REQUIRE_THROWS_WITH(profile_from_json(R"({"batch":4,"layers":[)" + layer + R"(],"bacth":2})"),
                      Catch::Contains("unknown key \"bacth\"") && Catch::Contains("expected only: layers, batch, model"));
  REQUIRE_THROWS_WITH(profile_from_json(R"({"batch":"4","layers":[)" + layer + "]}"),
                      Catch::Contains("profile.batch: got a JSON string (\"4\"), expected an integer"));
  REQUIRE_THROWS_WITH(profile_from_json(R"({"batch":0,"layers":[)" + layer + "]}"),
                      Catch::Contains("profile.batch: got 0, expected an integer in [1,"));
  REQUIRE_THROWS_WITH(
      profile_from_json(R"({"batch":4,"layers":[{"name":"a","forward_ms":-1,"backward_ms":2,"activation_bytes":3,"param_bytes":4}]})"),
      Catch::Contains("profile.layers[0].forward_ms: got -1, expected a finite number >= 0"));
  REQUIRE_THROWS_WITH(profile_from_json(R"({"batch":4,"layers":[{"name":"a"}]})"),
                      Catch::Contains("profile.layers[0]: missing key \"forward_ms\""));
  REQUIRE_THROWS_WITH(profile_from_json(R"({"batch":4,"layers":[]})"), Catch::Contains("expected at least one layer"));
  REQUIRE_THROWS_WITH(profile_from_json("{\"batch\":4,"), Catch::Contains("profile: not valid JSON"));
  REQUIRE_THROWS_WITH(load_profile("/nonexistent/profile.json"),
                      Catch::Contains("cannot open \"/nonexistent/profile.json\""));

  REQUIRE_THROWS_WITH(cluster_from_json(R"({"nodes":0,"devices_per_node":8,"intra_node_bytes_per_s":1,)"
                                        R"("inter_node_bytes_per_s":1,"memory_bytes_per_device":1})"),
                      Catch::Contains("cluster.nodes: got 0, expected an integer in [1,"));
  REQUIRE_THROWS_WITH(cluster_from_json(R"({"nodes":1,"devices_per_node":2.5,"intra_node_bytes_per_s":1,)"
                                        R"("inter_node_bytes_per_s":1,"memory_bytes_per_device":1})"),
                      Catch::Contains("cluster.devices_per_node: got 2.5, expected an integer"));
  REQUIRE_THROWS_WITH(cluster_from_json(R"({"nodes":1,"devices_per_node":2,"intra_node_bytes_per_s":0,)"
                                        R"("inter_node_bytes_per_s":1,"memory_bytes_per_device":1})"),
                      Catch::Contains("intra_node_bytes_per_s = 0, expected a bandwidth > 0"));
  REQUIRE_THROWS_WITH(cluster_from_json(R"({"nodes":1,"devices_per_node":2,"intra_node_bandwidth":1,)"
                                        R"("inter_node_bytes_per_s":1,"memory_bytes_per_device":1})"),
                      Catch::Contains("missing key \"intra_node_bytes_per_s\""));

  const std::string head = R"({"version":1,"num_layers":4,"global_batch":8,"micro_batches":2,"schedule":"1f1b",)";
  REQUIRE_THROWS_WITH(plan_from_json(head + R"("stages":[{"layers":[0,4],"ranks":[0]}],"extra":1})"),
                      Catch::Contains("plan: unknown key \"extra\""));
  REQUIRE_THROWS_WITH(plan_from_json(head + R"("stages":[{"layers":[0,4],"ranks":[0],"replicas":1}]})"),
                      Catch::Contains("plan.stages[0]: unknown key \"replicas\""));
  REQUIRE_THROWS_WITH(plan_from_json(head + R"("stages":[{"layers":[0,2],"ranks":[0]},{"layers":[3,4],"ranks":[1]}]})"),
                      Catch::Contains("stage 1 starts at layer 3 but the previous stage ends at layer 2"));
  REQUIRE_THROWS_WITH(plan_from_json(head + R"("stages":[{"layers":[0,4],"ranks":[0,1,2]}]})"),
                      Catch::Contains("the micro-batch of 4 samples (global_batch 8 / micro_batches 2) does not split among stage 0's 3 replicas"));
  REQUIRE_THROWS_WITH(plan_from_json(head + R"("stages":[{"layers":[0,4],"ranks":"0"}]})"),
                      Catch::Contains("plan.stages[0].ranks: got a JSON string, expected an array"));
  REQUIRE_THROWS_WITH(plan_from_json(R"({"version":2,"num_layers":4,"global_batch":8,"micro_batches":2,)"
                                     R"("schedule":"1f1b","stages":[]})"),
                      Catch::Contains("plan.version: got 2, expected 1"));
  REQUIRE_THROWS_WITH(plan_from_json(R"({"version":1,"num_layers":4,"global_batch":9,"micro_batches":2,)"
                                     R"("schedule":"1f1b","stages":[{"layers":[0,4],"ranks":[0]}]})"),
                      Catch::Contains("global_batch 9 does not split into 2 equal micro-batches"));
  REQUIRE_THROWS_WITH(plan_from_json(R"({"version":1,"num_layers":4,"global_batch":8,"micro_batches":2,)"
                                     R"("schedule":"zigzag","stages":[{"layers":[0,4],"ranks":[0]}]})"),
                      Catch::Contains("schedule 'zigzag' is unknown; expected \"gpipe\", \"1f1b\" or \"interleaved\""));
}

TEST_CASE("profile timings at other batch sizes, accumulation and optimizer times round-trip and interpolate",
          "[planner][json]") {
  ModelProfile p;
  p.batch = 8;
  LayerProfile l{"fc", 4.0, 8.0, 800, 4000, 1600};
  l.grad_accumulate_ms = 0.25;
  l.optimizer_ms = 0.5;
  l.timings = {{2, 2.0, 3.0}, {32, 12.0, 24.0}};
  p.layers = {l, {"head", 1.0, 1.0, 80, 400, -1}};
  const ModelProfile q = profile_from_json(profile_to_json(p));
  REQUIRE(q.layers[0].grad_accumulate_ms == 0.25);
  REQUIRE(q.layers[0].optimizer_ms == 0.5);
  REQUIRE(q.layers[0].timings.size() == 2);
  REQUIRE(q.layers[0].timings[1].batch == 32);
  REQUIRE(q.layers[0].timings[1].backward_ms == 24.0);
  REQUIRE(q.layers[1].timings.empty());
  REQUIRE(q.layers[1].optimizer_ms == 0);
  // Points (2: 2/3), (8: 4/8), (32: 12/24): linear between, per-sample of the nearest outside.
  const LayerProfile& a = q.layers[0];
  REQUIRE(a.time_at(8, 8).forward_ms == Approx(4.0));
  REQUIRE(a.time_at(5, 8).forward_ms == Approx(3.0));   // halfway from 2 to 8
  REQUIRE(a.time_at(5, 8).backward_ms == Approx(5.5));
  REQUIRE(a.time_at(20, 8).forward_ms == Approx(8.0));  // halfway from 8 to 32
  REQUIRE(a.time_at(1, 8).forward_ms == Approx(1.0));   // below 2: 2 ms / 2 samples
  REQUIRE(a.time_at(64, 8).backward_ms == Approx(48.0));  // above 32: 24 ms / 32 samples
  // One point only: plain linear scaling.
  REQUIRE(q.layers[1].time_at(4, 8).forward_ms == Approx(0.5));
  // The least time per sample is at a measured point (forward 12/32, backward 24/32 = 8/8 = 0.75).
  REQUIRE(a.min_ms_per_sample(8).first == Approx(0.375));
  REQUIRE(a.min_ms_per_sample(8).second == Approx(0.75));
  // Errors: a timing at the profile's own batch, a size twice, a missing key.
  const std::string head = R"({"batch":8,"layers":[{"name":"a","forward_ms":1,"backward_ms":1,"activation_bytes":1,)"
                           R"("param_bytes":1,"timings":)";
  REQUIRE_THROWS_WITH(profile_from_json(head + R"([{"batch":8,"forward_ms":1,"backward_ms":1}]}]})"),
                      Catch::Contains("profile.layers[0].timings[0].batch: got 8, the profile's own batch"));
  REQUIRE_THROWS_WITH(profile_from_json(head + R"([{"batch":2,"forward_ms":1,"backward_ms":1},)"
                                               R"({"batch":2,"forward_ms":1,"backward_ms":1}]}]})"),
                      Catch::Contains("timings[1].batch: got 2 twice"));
  REQUIRE_THROWS_WITH(profile_from_json(head + R"([{"batch":2,"forward_ms":1}]}]})"),
                      Catch::Contains("missing key \"backward_ms\""));
}

TEST_CASE("cluster allreduce figures and the overlap flag round-trip; bad values are errors", "[planner][json]") {
  const std::string base = R"({"nodes":1,"devices_per_node":2,"intra_node_bytes_per_s":4e9,"inter_node_bytes_per_s":4e9,)"
                           R"("memory_bytes_per_device":1e9,"intra_node_latency_us":40)";
  const Cluster plain = cluster_from_json(base + "}");
  REQUIRE(plain.communication_overlaps_compute);
  REQUIRE(plain.allreduce_bytes_per_s(false) == 4e9);  // the point-to-point figures stand in
  REQUIRE(plain.allreduce_latency_us(false) == 40);
  const Cluster c = cluster_from_json(
      base + R"(,"intra_node_allreduce_bytes_per_s":1.5e9,"intra_node_allreduce_latency_us":700,)"
             R"("communication_overlaps_compute":false})");
  REQUIRE(c.allreduce_bytes_per_s(false) == 1.5e9);
  REQUIRE(c.allreduce_latency_us(false) == 700);
  REQUIRE(c.allreduce_bytes_per_s(true) == 4e9);
  REQUIRE_FALSE(c.communication_overlaps_compute);
  const Cluster d = cluster_from_json(cluster_to_json(c));
  REQUIRE(d.intra_node_allreduce_bytes_per_s == 1.5e9);
  REQUIRE(d.intra_node_allreduce_latency_us == 700);
  REQUIRE_FALSE(d.communication_overlaps_compute);
  REQUIRE(cluster_to_json(plain).find("allreduce") == std::string::npos);
  REQUIRE_THROWS_WITH(cluster_from_json(base + R"(,"communication_overlaps_compute":1})"),
                      Catch::Contains("communication_overlaps_compute: got 1, expected true or false"));
  REQUIRE_THROWS_WITH(cluster_from_json(base + R"(,"intra_node_allreduce_bytes_per_s":0})"),
                      Catch::Contains("intra_node_allreduce_bytes_per_s: got 0, expected a bandwidth > 0"));
}
