// FullyShardedDataParallel (ZeRO-2 and ZeRO-3) in real processes over loopback: each case starts
// fsdp_worker copies (as chorusrun would) and requires every one to exit 0; what each checks is in
// fsdp_worker.cpp (against DDP + Adam on an identical model, float64, within 1e-10).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/distributed/worker_launcher.h"

namespace {

using chorus::testing::require_all_ok;

chorus::testing::Result run(int world, const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  return chorus::testing::run_workers(chorus::testing::runfile("tests/distributed/fsdp_worker"), world, args, env, 120);
}

}  // namespace

TEST_CASE("FSDP full_shard and shard_grad_op train as DDP: MLP and transformer at world sizes 2-4", "[distributed][fsdp]") {
  for (int world = 2; world <= 4; ++world) {
    for (const char* model : {"mlp", "transformer"}) {
      for (const char* strategy : {"full_shard", "shard_grad_op"}) {
        INFO(model << " " << strategy << " world " << world);
        require_all_ok(run(world, {"equivalence", model, strategy}));
      }
    }
  }
}

TEST_CASE("FSDP of GPT-tiny (its tied embedding in the root unit) trains as DDP", "[distributed][fsdp][models]") {
  for (const char* strategy : {"full_shard", "shard_grad_op"}) {
    INFO(strategy);
    require_all_ok(run(2, {"equivalence", "gpt", strategy}));
    require_all_ok(run(3, {"equivalence", "gpt", strategy}));
  }
}

TEST_CASE("FSDP without prefetch, and with gradients accumulated over two backward passes", "[distributed][fsdp]") {
  require_all_ok(run(3, {"equivalence", "transformer", "full_shard", "noprefetch"}));
  require_all_ok(run(2, {"equivalence", "mlp", "full_shard", "accumulate"}));
  require_all_ok(run(2, {"equivalence", "gpt", "shard_grad_op", "accumulate"}));
}

TEST_CASE("FSDP on sim devices: collectives on the communication stream, ordered by events", "[distributed][fsdp][sim]") {
  const std::vector<std::string> env = {"CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1"};
  require_all_ok(run(3, {"equivalence", "transformer", "full_shard", "sim:0"}, env));
  require_all_ok(run(2, {"equivalence", "gpt", "full_shard", "sim:0"}, env));
  require_all_ok(run(2, {"equivalence", "mlp", "shard_grad_op", "sim:0"}, env));
}

// distributed/fsdp.cpp, [Reductions before the next gather]: the middle block holds a layer only rank 1
// uses, so rank 0's flats of that block miss gradients. CHORUS_DISTRIBUTED_DEBUG=DETAIL compares
// every collective's op, sequence number and shapes across the ranks before it runs. With the rule
// every rank issues the same sequence and training equals DDP with find_unused_parameters (within
// 1e-10); removed, rank 0 reaches the next block's all-gather where rank 1 reaches the gated block's
// reduce-scatter, and every rank fails naming the mismatch (over NCCL, which matches by issue
// order, a hang or mixed data).
TEST_CASE("FSDP with a layer only one rank uses issues the same collectives on every rank", "[distributed][fsdp]") {
  const std::string detail = "CHORUS_DISTRIBUTED_DEBUG=DETAIL";
  for (const char* strategy : {"full_shard", "shard_grad_op"}) {
    INFO(strategy);
    require_all_ok(run(2, {"equivalence", "gated", strategy}, {detail}));
  }
  require_all_ok(run(3, {"equivalence", "gated", "full_shard", "noprefetch"}, {detail}));
  require_all_ok(run(2, {"equivalence", "gated", "full_shard", "sim:0"}, {detail, "CHORUS_SIM_DELAY_US=200"}));
  const chorus::testing::Result r =
      run(2, {"equivalence", "gated", "full_shard"}, {detail, "CHORUS_TEST_FAULT=fsdp_reductions_before_gather"});
  INFO(r.output);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(r.codes[rank] == 1);
    const std::string log = chorus::testing::rank_log(r, rank);
    CHECK(log.find("collective mismatch detected") != std::string::npos);
    CHECK(log.find("allgather") != std::string::npos);
    CHECK(log.find("reduce_scatter") != std::string::npos);
  }
}

TEST_CASE("FSDP sharded checkpoints resume bit-exactly, read whole, and reshard to another world size", "[distributed][fsdp][checkpoint]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  for (const char* model : {"mlp", "gpt"}) {
    const std::string dir = std::string(tmp ? tmp : "/tmp") + "/fsdp_checkpoint_" + model;
    INFO(model);
    require_all_ok(run(4, {"checkpoint", model, "full_shard", dir, "save"}));
    require_all_ok(run(2, {"checkpoint", model, "full_shard", dir, "reshard"}));
    require_all_ok(run(3, {"checkpoint", model, "shard_grad_op", dir, "reshard"}));
  }
}

TEST_CASE("FSDP mixed precision: bf16 gathers and compute over float32 shards track float32 DDP", "[distributed][fsdp][amp]") {
  for (const char* model : {"mlp", "transformer", "gpt"}) {
    INFO(model);
    require_all_ok(run(2, {"mixed", model}));
  }
}

// distributed/sharded_grad_scaler.h: an inf in one rank's shard; every rank skips and backs off.
TEST_CASE("FSDP with ShardedGradScaler: an overflow in one rank's shard skips the step on every rank", "[distributed][fsdp][amp]") {
  require_all_ok(run(2, {"scaler"}));
  require_all_ok(run(3, {"scaler"}));
}

TEST_CASE("FSDP refuses another model on one rank, frozen parameters and blocks owning nothing", "[distributed][fsdp][errors]") {
  require_all_ok(run(2, {"errors"}));
}

// Negative controls (tensor/fault.h): without the wait for a unit's all-gather, sim's stream-order
// sanitizer reports the copy that reads the gathered buffer before the collective wrote it; without
// full_shard's gather before a unit's backward, backward reads parameters whose memory is freed,
// which is a clear error on every rank (not a crash or a wrong gradient).
TEST_CASE("FSDP negative controls: the all-gather wait on sim, the pre-backward gather", "[distributed][fsdp][sim]") {
  chorus::testing::require_sanitizer_report(
      run(2, {"equivalence", "transformer", "full_shard", "sim:0"},
          {"CHORUS_TEST_FAULT=fsdp_gather_wait", "CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1"}),
      "FSDP without the all-gather's wait");
  const chorus::testing::Result r = run(2, {"equivalence", "mlp", "full_shard"}, {"CHORUS_TEST_FAULT=fsdp_pre_backward_gather"});
  INFO(r.output);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(r.codes[rank] == 1);
    const std::string log = chorus::testing::rank_log(r, rank);
    CHECK(log.find("unexpected error in equivalence") != std::string::npos);
    CHECK(log.find("storage is released") != std::string::npos);
  }
}
