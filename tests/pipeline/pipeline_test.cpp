// The DAPPLE runtime in real processes: each case starts pipeline_worker copies over loopback (as
// chorusrun would) and requires every one to exit 0; what each scenario checks is in
// pipeline_worker.cpp. Several configurations share one job (one process start-up) to keep the
// suite short on 2 cores. The matrix (model/replicas per stage/micro-batches/schedule):
//   2 processes: 2 stages, M = 1, 2, 4, 8 (1F1B), M = 4, 8 (GPipe); the transformer with both
//   3 processes: 3 stages (M = 2 < S, 4; both schedules); 2+1 and 1+2 replicas; transformer 2+1, 1+1+1
//   4 processes: 2 stages x 2 replicas (both schedules, both models); 4 stages; 1+2+1 replicas
//   on sim devices (3 processes): 3 stages; 2+1 (transformer, GPipe); 1+2
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tests/distributed/worker_launcher.h"

namespace {

using chorus::testing::require_all_ok;

chorus::testing::Result run(int world, const std::vector<std::string>& args, double limit_s = 120,
                            const std::vector<std::string>& env = {}) {
  return chorus::testing::run_workers(chorus::testing::runfile("tests/pipeline/pipeline_worker"), world, args, env,
                                      limit_s);
}

}  // namespace

TEST_CASE("2 stages train exactly as one process: M = 1..8, GPipe and 1F1B, MLP and transformer", "[pipeline][equivalence]") {
  require_all_ok(run(2, {"equivalence", "mlp/1,1/1/1f1b", "mlp/1,1/2/1f1b", "mlp/1,1/4/1f1b", "mlp/1,1/8/1f1b",
                         "mlp/1,1/4/gpipe", "mlp/1,1/8/gpipe", "transformer/1,1/4/1f1b", "transformer/1,1/2/gpipe"}));
}

TEST_CASE("3 stages and non-uniform replication (2+1, 1+2) train exactly as one process", "[pipeline][equivalence]") {
  require_all_ok(run(3, {"equivalence", "mlp/1,1,1/4/1f1b", "mlp/1,1,1/2/1f1b", "mlp/1,1,1/4/gpipe", "mlp/2,1/4/1f1b",
                         "mlp/1,2/8/gpipe", "transformer/2,1/2/1f1b", "transformer/1,1,1/8/1f1b"}));
}

TEST_CASE("2 stages x 2 replicas, 4 stages and 1+2+1 replicas train exactly as one process", "[pipeline][equivalence]") {
  require_all_ok(run(4, {"equivalence", "mlp/2,2/4/1f1b", "mlp/2,2/2/gpipe", "transformer/2,2/4/1f1b",
                         "mlp/1,1,1,1/8/1f1b", "mlp/1,2,1/2/1f1b"}));
}

// A layer that only some micro-batches use (the "routed" model: rows 8 and 11 of 16 take it), with
// 2 replicas of its stage and find_unused_parameters: the gradients it gets in a micro-batch whose
// backward runs after the synced micro-batch's forward reach the allreduce (reducer.cpp, [Unused
// parameters at the first hook]).
TEST_CASE("a layer some micro-batches skip, replicated stage, find_unused_parameters: trains exactly as one process", "[pipeline][equivalence]") {
  require_all_ok(run(3, {"equivalence", "routed/2,1/4/gpipe", "routed/2,1/4/1f1b"}));
}

// Real models as blocks (blocks.h): GPT-tiny (its word embedding tied between the first and last
// stages) and BERT-tiny (input ids, attention mask and labels cross every boundary; tied decoder).
TEST_CASE("GPT-tiny and BERT-tiny: 2 stages x 2 replicas, 4 stages (GPipe, 1F1B) train exactly as one process", "[pipeline][equivalence][models]") {
  require_all_ok(run(4, {"equivalence", "gpt/2,2/4/1f1b", "gpt/1,1,1,1/4/gpipe", "gpt/1,1,1,1/4/1f1b", "bert/2,2/4/1f1b",
                         "bert/1,1,1,1/4/gpipe", "bert/1,1,1,1/4/1f1b"}));
}

TEST_CASE("GPT-tiny and BERT-tiny: 2+1 replicas train exactly as one process, with recomputation, with clipping", "[pipeline][equivalence][models]") {
  require_all_ok(run(3, {"equivalence", "gpt/2,1/4/1f1b", "bert/2,1/2/1f1b", "bert/1,2/2/gpipe/recompute",
                         "gpt/1,1,1/4/1f1b/recompute", "gpt/2,1/2/1f1b/clip", "bert/1,1,1/2/gpipe/clip"}));
}

// Sharded checkpoints with optimizer (Adam) and scheduler state: resume bit for bit, the whole model
// from the files, a second checkpoint replacing the first, another plan refused.
TEST_CASE("a pipelined run checkpoints by stage and resumes bit for bit", "[pipeline][checkpoint]") {
  require_all_ok(run(3, {"checkpoint", "gpt/2,1/2/1f1b", "bert/1,1,1/2/gpipe", "mlp/1,2/4/1f1b"}));
  require_all_ok(run(2, {"checkpoint", "gpt/1,1/2/1f1b/sim:0"}, 120, {"CHORUS_SIM_DELAY_US=200"}));
}

// Interleaved 1F1B (virtual stages: each process holds 2 or 3 chunks of the model; Megatron-LM's
// schedule): the same results as one process, with replicas, recomputation, on sim, and its
// checkpoints resume bit for bit.
TEST_CASE("interleaved 1F1B trains exactly as one process", "[pipeline][equivalence][interleaved]") {
  require_all_ok(run(2, {"equivalence", "gpt/1,1/4/interleaved2", "bert/1,1/2/interleaved2", "mlp/1,1/4/interleaved3",
                         "gpt/1,1/2/interleaved2/recompute", "transformer/1,1/2/interleaved2/clip"}));
  require_all_ok(run(3, {"equivalence", "mlp/2,1/4/interleaved2", "gpt/1,2/2/interleaved2"}));
  require_all_ok(run(2, {"equivalence", "gpt/1,1/4/interleaved2/sim:0"}, 120, {"CHORUS_SIM_DELAY_US=200"}));
  require_all_ok(run(2, {"checkpoint", "gpt/1,1/2/interleaved2"}));
}

// Negative control: without the sum of the tied word embedding's gradients over the first and last
// stages, the copies drift from single-process training and the test fails on both stages.
TEST_CASE("without the tied-gradient sum, GPT-tiny's pipeline departs from one process", "[pipeline][models]") {
  const chorus::testing::Result r =
      run(2, {"equivalence", "gpt/1,1/2/1f1b"}, 120, {"CHORUS_TEST_FAULT=tied_gradient_sum"});
  INFO(r.output);
  REQUIRE(r.codes.size() == 2);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(r.codes[rank] == 1);
    CHECK(chorus::testing::rank_log(r, rank).find("transformer.wte.weight differs from single-process training") !=
          std::string::npos);
  }
}

// Mixed precision (PipelineOptions::autocast = bfloat16; float32 models): the reference runs under
// the same autocast; parameters within 5% of how far training moved them (the micro-batches'
// GEMMs round in bfloat16 with other shapes), losses within 1%, and not float32's loss.
TEST_CASE("GPT-tiny and BERT-tiny under bfloat16 autocast train as one process does", "[pipeline][models][amp]") {
  require_all_ok(run(3, {"equivalence", "gpt/2,1/4/1f1b/bf16", "bert/1,1,1/2/gpipe/recompute/bf16"}));
}

TEST_CASE("GPT-tiny and BERT-tiny on sim devices train exactly as one process", "[pipeline][sim][models]") {
  require_all_ok(run(4, {"equivalence", "gpt/2,2/4/1f1b/sim:0", "bert/1,1,1,1/4/1f1b/sim:0"}, 180,
                     {"CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1"}));
  require_all_ok(run(3, {"equivalence", "gpt/2,1/4/1f1b/sim:0", "bert/2,1/2/gpipe/sim:0"}, 180,
                     {"CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1"}));
}

// On sim devices the boundary tensors and the replicas' gradient buckets go through the
// stream-ordered group's communication streams (ordered by events, random delays before every
// stream task, sim's driver lock on), as they will on CUDA with NCCL.
TEST_CASE("on sim devices, through the stream-ordered group, pipelines train exactly as one process", "[pipeline][sim]") {
  require_all_ok(run(3, {"equivalence", "mlp/1,1,1/4/1f1b/sim:0", "transformer/2,1/2/gpipe/sim:0", "mlp/1,2/4/1f1b/sim:0"},
                     120, {"CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1"}));
}

// Negative controls (tensor/test_faults.h): with the ready wait or the end wait of the group's
// [Sync Streams] removed, the stream-order sanitizer stops the pipeline at its first boundary tensor
// or bucket used unordered (some rank reports; every rank exits non-zero; none hangs).
TEST_CASE("a pipeline with an ordering point removed is stopped by the stream-order sanitizer", "[pipeline][sim]") {
  for (const std::string point : {"ready_wait", "end_wait"}) {
    chorus::testing::require_sanitizer_report(
        run(2, {"equivalence", "mlp/1,1/4/1f1b/sim:0"}, 120, {"CHORUS_SIM_DRIVER_LOCK=1", "CHORUS_TEST_FAULT=" + point}),
        point);
  }
}

// The same with every rank's current stream a side stream (the stream-order sanitizer, on for sim,
// reports any boundary tensor or bucket used unordered).
TEST_CASE("on sim devices with side streams as the current streams, pipelines train exactly as one process", "[pipeline][sim]") {
  require_all_ok(run(3, {"equivalence", "mlp/1,1,1/4/1f1b/sim:0", "mlp/1,2/4/1f1b/sim:0"}, 120,
                     {"CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1", "CHORUS_TEST_SIDE_STREAM=1"}));
}

// Activation recomputation (PipelineOptions::recompute): the same results, on the CPU and on sim
// (the recomputed forward's dropout-free MLP and transformer; the generator replay is
// tests/nn:checkpoint_test's).
TEST_CASE("with activation recomputation, pipelines train exactly as one process", "[pipeline]") {
  require_all_ok(run(2, {"equivalence", "mlp/1,1/4/1f1b/recompute", "transformer/1,1/2/gpipe/recompute"}));
  require_all_ok(run(3, {"equivalence", "mlp/1,2/4/1f1b/sim:0/recompute"}, 120,
                     {"CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1"}));
}

TEST_CASE("1F1B holds far less activation memory than GPipe on the first stage", "[pipeline][memory]") {
  require_all_ok(run(2, {"memory"}));
}

TEST_CASE("a stage killed mid-step makes its neighbours fail with a clear error, not hang", "[pipeline][faults]") {
  require_all_ok(run(3, {"killed"}, 60));
}

TEST_CASE("a boundary tensor that changes shape after the first step is an error, not a hang", "[pipeline][faults]") {
  require_all_ok(run(2, {"shape_change"}, 60));
}

TEST_CASE("a boundary tensor not on the stage's device is an error, not a message to the wrong communicator", "[pipeline][faults][sim]") {
  require_all_ok(run(2, {"wrong_device"}, 60));
}

TEST_CASE("plans for another model or world size, and batches of the wrong size, are refused", "[pipeline][errors]") {
  require_all_ok(run(2, {"errors"}));
}
