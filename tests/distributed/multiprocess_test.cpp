// Multi-process tests: each case starts world_size real processes of dist_worker (the environment
// chorusrun gives: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a free loopback port), which talk
// through a TCPStore and Gloo over loopback, and requires every one of them to exit 0. What each
// scenario checks is in dist_worker.cpp.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tensor/sanitizers.h"
#include "tests/distributed/worker_launcher.h"

using chorus::testing::require_all_ok;
using chorus::testing::Result;
using chorus::testing::run_dist_workers;

TEST_CASE("every collective and dtype gives the expected values at world sizes 1 to 4", "[distributed][collectives]") {
  for (int world = 1; world <= 4; ++world) {
    INFO("world size " << world);
    require_all_ok(run_dist_workers(world, {"collectives"}));
  }
}

TEST_CASE("DDP equals single-process training on the whole batch (MLP, CNN, transformer; ws 1-4)", "[distributed][ddp]") {
  for (int world = 1; world <= 4; ++world) {
    for (const char* kind : {"mlp", "cnn", "transformer"}) {
      INFO("world size " << world << " model " << kind);
      require_all_ok(run_dist_workers(world, {"ddp", kind, "float64", "25", "0"}));
    }
  }
  // float32; a tiny bucket cap (a bucket per parameter or two); gradient_as_bucket_view.
  for (const char* kind : {"mlp", "cnn", "transformer"}) {
    INFO("model " << kind);
    require_all_ok(run_dist_workers(2, {"ddp", kind, "float32", "25", "0"}));
    require_all_ok(run_dist_workers(3, {"ddp", kind, "float64", "0.0005", "0"}));
    require_all_ok(run_dist_workers(2, {"ddp", kind, "float64", "0.0005", "1"}));
    require_all_ok(run_dist_workers(2, {"ddp", kind, "float32", "25", "1"}));
  }
}

// The stream-ordered group on sim devices: each rank's replica lives on sim:0 (its own process's
// simulated device), buckets are reduced by Gloo on the communication stream's thread, ordered by
// events; random delays before every stream task. Equal to single-process CPU training.
TEST_CASE("DDP on sim devices equals single-process training, with no host block in backward", "[distributed][ddp][sim]") {
  // With sim's driver lock (tensor/sim/sim.h), as CUDA's: the scenarios end with blocking copies to
  // host memory while buckets may still be on the wire, which deadlocked the Gloo staging of an
  // H100 run whose thread made CUDA calls the stream waited for.
  const std::vector<std::string> delays{"CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1"};
  for (const std::string kind : {"mlp", "cnn", "transformer"}) {
    INFO(kind);
    require_all_ok(run_dist_workers(2, {"ddp", kind, "float64", "25", "0", "sim:0"}, delays));
  }
  require_all_ok(run_dist_workers(3, {"ddp", "mlp", "float64", "0.0005", "0", "sim:0"}, delays));
  require_all_ok(run_dist_workers(2, {"ddp", "cnn", "float64", "0.0005", "1", "sim:1"}, delays));
  require_all_ok(run_dist_workers(2, {"ddp", "mlp", "float32", "25", "0", "sim:0"}, delays));
  require_all_ok(run_dist_workers(2, {"no_sync", "sim:0"}, delays));
  require_all_ok(run_dist_workers(3, {"find_unused", "sim:0"}, delays));
  require_all_ok(run_dist_workers(3, {"join", "sim:0"}, delays));
  require_all_ok(run_dist_workers(2, {"syncbn", "sim:0"}, delays));
  // (Device tensors reach Gloo through page-locked host copies the stream makes, ordered by flag
  // words a thread of the stream's own polls and stores: the send/receive ring of "collectives"
  // below deadlocked on a GPU when the copies or the collectives sat in host functions.)
  for (int world = 1; world <= 3; ++world) {
    INFO("every collective and dtype on sim:0, world size " << world);
    require_all_ok(run_dist_workers(world, {"collectives", "sim:0"}, delays));
  }
  require_all_ok(run_dist_workers(3, {"no_sync", "sim:0", "fp16_hook"}, delays));
  require_all_ok(run_dist_workers(2, {"no_sync", "sim:0", "bf16_hook"}, delays));
  require_all_ok(run_dist_workers(3, {"find_unused", "sim:0", "static_graph"}, delays));
}

// The same with the user's current stream a side stream (not the default one) on every rank: the
// ready event must be recorded on, and the end waited from, the caller's current stream; the
// stream-order sanitizer (on for sim) reports any access the side stream makes unordered.
TEST_CASE("DDP, no_sync, join, find_unused, SyncBatchNorm and the optimizers on a side stream equal training on the default one", "[distributed][ddp][sim]") {
  const std::vector<std::string> env{"CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1", "CHORUS_TEST_SIDE_STREAM=1"};
  require_all_ok(run_dist_workers(2, {"ddp", "mlp", "float64", "0.0005", "1", "sim:0"}, env));
  require_all_ok(run_dist_workers(2, {"ddp", "cnn", "float32", "25", "0", "sim:0"}, env));
  require_all_ok(run_dist_workers(2, {"no_sync", "sim:0", "fp16_hook"}, env));
  require_all_ok(run_dist_workers(3, {"join", "sim:0"}, env));
  require_all_ok(run_dist_workers(2, {"find_unused", "sim:0"}, env));
  require_all_ok(run_dist_workers(2, {"syncbn", "sim:0"}, env));
}


// Negative controls (tensor/test_faults.h): each ordering point of [Sync Streams] removed in a real
// two-process DDP job on sim; the sanitizer stops it at the first unordered access, whatever order
// the streams happened to run in.
TEST_CASE("DDP with an ordering point removed is stopped by the stream-order sanitizer", "[distributed][ddp][sim]") {
  const std::vector<std::string> base{"CHORUS_SIM_DRIVER_LOCK=1"};
  for (const std::string point : {"ready_wait", "end_wait"}) {
    std::vector<std::string> env = base;
    env.push_back("CHORUS_TEST_FAULT=" + point);
    chorus::testing::require_sanitizer_report(run_dist_workers(2, {"ddp", "mlp", "float64", "0.0005", "0", "sim:0"}, env, 120), point);
  }
  // Both waits on the default stream while the caller works on a side stream.
  chorus::testing::require_sanitizer_report(run_dist_workers(2, {"ddp", "mlp", "float64", "0.0005", "0", "sim:0"},
                                            {"CHORUS_SIM_DRIVER_LOCK=1", "CHORUS_TEST_SIDE_STREAM=1",
                                             "CHORUS_TEST_FAULT=caller_stream"},
                                            120),
                           "caller_stream");
}

// A negative control run without the stream-order sanitizer's verdict to rely on: DDP on sim with
// ordering points removed must come out wrong on every rank (the worker checks "still matched").
static void require_goes_wrong(const std::string& order, const std::vector<std::string>& env) {
  const std::vector<std::string> args{"ddp", "mlp", "float64", "0.0005", "0", "sim:0", order};
#if CHORUS_TSAN
  // Under ThreadSanitizer the missing waits are a data race: either it reports the race (a worker
  // stops there, between a compute stream's kernel and the communication that overwrites its
  // buffer, or between the lane worker and a stream's copy of the same host memory), or, where the
  // racing accesses fell outside what it tracks (libgloo's reads are not instrumented), every
  // worker finds the result wrong, as without TSan.
  // Either outcome is specific: a worker that stopped did so on TSan's report (exit code 66, the
  // report in its own log), no worker found the result right ("still matched"), no hang; or, with
  // no report anywhere, every worker found the result wrong (exit 0, as without TSan).
  const Result r = run_dist_workers(2, args, env);
  INFO(r.output);
  if (r.output.find("WARNING: ThreadSanitizer: data race") != std::string::npos) {
    int reported = 0;
    for (size_t rank = 0; rank < r.codes.size(); ++rank) {
      INFO("rank " << rank << " exit code " << r.codes[rank]);
      CHECK(r.codes[rank] != 999);  // not killed for hanging
      const std::string log = chorus::testing::rank_log(r, static_cast<int>(rank));
      if (r.codes[rank] == 66 && log.find("WARNING: ThreadSanitizer: data race") != std::string::npos) ++reported;
    }
    CHECK(reported >= 1);
    CHECK(r.output.find("still matched") == std::string::npos);
  } else {
    require_all_ok(r);
  }
#else
  require_all_ok(run_dist_workers(2, args, env));
#endif
}

TEST_CASE("without the communication stream's event waits DDP on sim goes wrong", "[distributed][ddp][sim]") {
  // The same job with the waits of [Sync Streams] removed (test-only) and the stream-order sanitizer
  // off must not match: the numbers themselves show the ordering test above can fail.
  require_goes_wrong("unordered", {"CHORUS_STREAM_SANITIZER=0"});
}

// The Gloo lane's two flag words (distributed/gloo_communicator.cpp) order host threads against
// a stream through page-locked memory, which the stream-order sanitizer does not see (it checks
// device accesses): removing either is caught by the numbers, with the sanitizer on. Without
// `ready` the lane worker reduces host copies the stream has not made yet (the compute stream is
// held back 30 ms before each backward); without `done` the stream copies back host copies the
// collectives have not written yet.
TEST_CASE("without the Gloo lane's ready or done flag DDP on sim goes wrong", "[distributed][ddp][sim]") {
  for (const std::string point : {"gloo_ready_flag", "gloo_done_flag"}) {
    INFO(point << " removed");
    require_goes_wrong("unordered:" + point, {"CHORUS_SIM_DRIVER_LOCK=1"});
  }
}

TEST_CASE("a stuck peer's collective on a communication stream raises on the next call, not a hang", "[distributed][faults][sim]") {
  require_all_ok(run_dist_workers(2, {"stream_timeout"}, {}, 60));
  // A rank that dies mid-run: both others raise (op, sequence number, device) and exit.
  require_all_ok(run_dist_workers(3, {"killed_rank", "sim:0"}, {}, 60));
}

TEST_CASE("ZeroRedundancyOptimizer (ZeRO-1) steps as DDP + Adam, holds 1/N of the state, consolidates and reshards", "[distributed][zero]") {
  for (int world = 2; world <= 4; ++world) {
    INFO("world size " << world);
    require_all_ok(run_dist_workers(world, {"zero1"}));
  }
  require_all_ok(run_dist_workers(3, {"zero1", "sim:0"}, {"CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1"}));
  // Another model on one rank: an error on every rank, not a hang.
  require_all_ok(run_dist_workers(3, {"zero1_mismatch"}, {}, 60));
}

TEST_CASE("round-robin process groups: collectives and DDP as over one group", "[distributed][groups]") {
  require_all_ok(run_dist_workers(2, {"round_robin"}));
  require_all_ok(run_dist_workers(3, {"round_robin"}));
}

TEST_CASE("hierarchical allreduce: 2 nodes x 2, 1 x 4, 4 x 1, 1 x 3 and 3 x 1 sum as the flat one", "[distributed][hierarchical]") {
  for (int local : {2, 4, 1}) {
    INFO("4 processes, " << local << " per node");
    require_all_ok(run_dist_workers(4, {"hierarchical", std::to_string(local)}));
  }
  for (int local : {3, 1}) {
    INFO("3 processes, " << local << " per node");
    require_all_ok(run_dist_workers(3, {"hierarchical", std::to_string(local)}));
  }
}

TEST_CASE("PowerSGD: exact on sums of low rank, error feedback, and DDP training with it", "[distributed][powersgd]") {
  require_all_ok(run_dist_workers(2, {"powersgd"}));
  require_all_ok(run_dist_workers(3, {"powersgd"}));
  require_all_ok(run_dist_workers(2, {"powersgd", "sim:0"}, {"CHORUS_SIM_DELAY_US=200", "CHORUS_SIM_DRIVER_LOCK=1"}));
}

TEST_CASE("no_sync accumulates locally and the next synced backward reduces the sum", "[distributed][ddp]") {
  require_all_ok(run_dist_workers(2, {"no_sync"}));
  require_all_ok(run_dist_workers(3, {"no_sync"}));
}

// PyTorch's semantics, which the reducer missed before 2026-12-04 (dist_worker.cpp,
// scenario_no_sync_unused): a parameter used only in no_sync micro-batches is reduced like any.
TEST_CASE("no_sync with find_unused_parameters reduces what accumulated, also for branches the synced backward misses", "[distributed][ddp]") {
  require_all_ok(run_dist_workers(2, {"no_sync_unused"}));
  require_all_ok(run_dist_workers(3, {"no_sync_unused", "cpu", "view"}));
  require_all_ok(run_dist_workers(2, {"no_sync_unused", "sim:0", "view"}, {"CHORUS_SIM_DELAY_US=200"}));
}

TEST_CASE("find_unused_parameters handles a branch used on some ranks only", "[distributed][ddp]") {
  require_all_ok(run_dist_workers(2, {"find_unused"}));
  require_all_ok(run_dist_workers(3, {"find_unused"}));
}

TEST_CASE("DDP errors: unused parameters without the flag, and models that differ across ranks", "[distributed][errors]") {
  require_all_ok(run_dist_workers(2, {"prior_iteration"}));
  require_all_ok(run_dist_workers(2, {"model_mismatch"}));
}

TEST_CASE("a killed rank and a stuck rank make the others fail within the timeout, not hang", "[distributed][faults]") {
  require_all_ok(run_dist_workers(2, {"killed_rank"}, {}, 60));
  require_all_ok(run_dist_workers(2, {"timeout"}, {}, 60));
}

TEST_CASE("debug mode catches ranks calling mismatched collectives", "[distributed][debug]") {
  require_all_ok(run_dist_workers(2, {"debug_mismatch"}, {"CHORUS_DISTRIBUTED_DEBUG=DETAIL"}, 60));
}

TEST_CASE("new_group makes subgroups with their own rank numbering", "[distributed][groups]") {
  require_all_ok(run_dist_workers(4, {"new_group"}));
}

TEST_CASE("collectives pair up after point-to-point traffic that only some ranks took part in", "[distributed][p2p]") {
  require_all_ok(run_dist_workers(3, {"p2p_then_collective"}, {}, 60));
}

TEST_CASE("point-to-point works complete when waited, polled, given a callback or dropped", "[distributed][p2p]") {
  require_all_ok(run_dist_workers(2, {"p2p_completion"}, {}, 60));
}

TEST_CASE("workers started with only Open MPI's or SLURM's variables join the job", "[distributed][launch]") {
  // No RANK / WORLD_SIZE: mpirun's OMPI_COMM_WORLD_* (MASTER_ADDR given), or srun's SLURM_* with the
  // master taken from SLURM_JOB_NODELIST's first host; the collectives scenario runs as under chorusrun.
  require_all_ok(run_dist_workers(3, {"collectives"}, {"CHORUS_TEST_LAUNCHER=openmpi"}));
  require_all_ok(run_dist_workers(2, {"collectives"}, {"CHORUS_TEST_LAUNCHER=slurm"}));
}

TEST_CASE("join lets ranks with fewer batches finish while the others train on", "[distributed][ddp][join]") {
  require_all_ok(run_dist_workers(2, {"join"}));
  require_all_ok(run_dist_workers(3, {"join"}));
}

// ddp.cpp, [Buffers as PyTorch syncs them]: BatchNorm statistics inside join() from the highest rank
// with data, and an evaluation of a different number of batches per rank through DDP, with every
// collective's fingerprint compared across ranks.
TEST_CASE("DDP's buffers: from the highest rank still training in join, once per evaluation under NoGrad", "[distributed][ddp][join]") {
  require_all_ok(run_dist_workers(2, {"buffers"}, {"CHORUS_DISTRIBUTED_DEBUG=DETAIL"}));
  require_all_ok(run_dist_workers(3, {"buffers"}, {"CHORUS_DISTRIBUTED_DEBUG=DETAIL"}));
}

// reducer.cpp: a rank whose forward reaches no parameter still finalizes each backward.
TEST_CASE("find_unused_parameters: a rank that reaches no parameter still finalizes", "[distributed][ddp]") {
  require_all_ok(run_dist_workers(2, {"unused_rank"}, {"CHORUS_DISTRIBUTED_DEBUG=DETAIL"}));
  require_all_ok(run_dist_workers(3, {"unused_rank"}, {"CHORUS_DISTRIBUTED_DEBUG=DETAIL"}));
}

TEST_CASE("SyncBatchNorm under DDP equals BatchNorm on the whole batch", "[distributed][syncbn]") {
  for (int world = 1; world <= 3; ++world) {
    INFO("world size " << world);
    require_all_ok(run_dist_workers(world, {"syncbn"}));
  }
}

TEST_CASE("SyncBatchNorm under bfloat16 autocast stays bfloat16 and tracks BatchNorm", "[distributed][syncbn][autocast]") {
  require_all_ok(run_dist_workers(2, {"syncbn_amp"}));
  require_all_ok(run_dist_workers(2, {"syncbn_amp", "sim:0"}, {"CHORUS_SIM_DRIVER_LOCK=1"}));
}
