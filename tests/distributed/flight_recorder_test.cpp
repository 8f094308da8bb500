// distributed::FlightRecorder in one process: the ring (capacity, states, ids that fell out), the
// dump's JSON form read back and malformed dumps refused, the desync report from hand-made records
// (a rank that skipped, one that ran another collective, one that sent nothing, all alike), the
// table, and the exchange of records over a real TCPStore between three recorders standing for
// three ranks, one of them answering as its heartbeat would. (tests/distributed:chorusrun_test
// times out real collectives between processes.)
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "distributed/flight_recorder.h"
#include "distributed/store.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace chorus;
using namespace chorus::distributed;
using namespace std::chrono_literals;

namespace {

// A rank's dump with collectives #0..#n-1 of group g, each "allreduce(sum) float32[4]" finished,
// except those `overrides` gives.
FlightDump dump_of(int rank, int n, std::map<uint64_t, std::pair<std::string, FlightState>> overrides = {}) {
  FlightRecorder r(100);
  for (int s = 0; s < n; ++s) {
    auto it = overrides.find(static_cast<uint64_t>(s));
    const std::string op = it == overrides.end() ? "allreduce(sum)" : it->second.first;
    const uint64_t id = r.issue("g", static_cast<uint64_t>(s), false, op, "float32[4]");
    const FlightState st = it == overrides.end() ? FlightState::Finished : it->second.second;
    if (st != FlightState::Issued) r.start(id);
    if (st == FlightState::Finished) r.finish(id);
    if (st == FlightState::Failed) r.finish(id, "Timed out waiting 3000ms for recv operation to complete");
  }
  FlightDump d = r.snapshot("test");
  d.rank = rank;
  d.world_size = 3;
  return d;
}

}  // namespace

TEST_CASE("the ring keeps the last entries with their states", "[distributed][flight]") {
  FlightRecorder r(3);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(r.issue("g", static_cast<uint64_t>(i), false, "barrier", ""));
  CHECK(ids == std::vector<uint64_t>{1, 2, 3, 4, 5});
  r.start(ids[3]);
  r.finish(ids[4]);
  r.finish(ids[2], "boom");
  r.finish(ids[0]);  // fell out of the ring: ignored
  const auto e = r.entries();
  REQUIRE(e.size() == 3);
  CHECK(e[0].seq == 2);
  CHECK(e[0].state == FlightState::Failed);
  CHECK(e[0].error == "boom");
  CHECK(e[1].state == FlightState::Started);
  CHECK(e[1].started_s > 0);
  CHECK(e[1].finished_s == 0);
  CHECK(e[2].state == FlightState::Finished);
  CHECK(e[2].started_s == e[2].finished_s);  // finished without a separate start: started then
  CHECK(r.snapshot("x").dropped == 2);
  CHECK(r.snapshot("x", 1).entries.size() == 1);
  CHECK(r.snapshot("x", 1).dropped == 4);
  FlightRecorder off(0);
  CHECK(off.issue("g", 0, false, "barrier", "") == 0);
  off.finish(0);
  CHECK(off.entries().empty());
}

TEST_CASE("a dump reads back as written, and what is not a dump is refused", "[distributed][flight]") {
  FlightDump d = dump_of(1, 3, {{2, {"broadcast(root=0)", FlightState::Failed}}});
  d.entries.push_back(d.entries.back());
  d.entries.back().p2p = true;
  d.entries.back().op = "send(to 2, tag 0)";
  const FlightDump back = parse_flight_dump(to_json(d), "test");
  CHECK(back.rank == 1);
  CHECK(back.world_size == 3);
  CHECK(back.reason == "test");
  REQUIRE(back.entries.size() == d.entries.size());
  for (size_t i = 0; i < d.entries.size(); ++i) {
    CHECK(back.entries[i].id == d.entries[i].id);
    CHECK(back.entries[i].seq == d.entries[i].seq);
    CHECK(back.entries[i].p2p == d.entries[i].p2p);
    CHECK(back.entries[i].signature() == d.entries[i].signature());
    CHECK(back.entries[i].state == d.entries[i].state);
    CHECK(back.entries[i].error == d.entries[i].error);
    CHECK(back.entries[i].issued_s == d.entries[i].issued_s);
  }
  CHECK_THROWS_WITH(parse_flight_dump("{oops", "a.json"),
                    Catch::Contains("flight recorder dump a.json: not JSON") &&
                        Catch::Contains("expected a chorus flight-recorder dump"));
  CHECK_THROWS_WITH(parse_flight_dump("{\"rank\": 0}", "b.json"),
                    Catch::Contains("b.json: no \"format\": \"chorus flight recorder\" field"));
  std::string text = to_json(d);
  CHECK_THROWS_WITH(parse_flight_dump(std::regex_replace(text, std::regex("\"version\": 1"), "\"version\": 7"), "c"),
                    Catch::Contains("version 7 (this chorus reads version 1)"));
  CHECK_THROWS_WITH(parse_flight_dump(std::regex_replace(text, std::regex("\"state\": \"finished\""), "\"state\": \"done\"", std::regex_constants::format_first_only), "d"),
                    Catch::Contains("d: entry 0 has state 'done': expected issued, started, finished or failed"));
  CHECK_THROWS_WITH(parse_flight_dump(std::regex_replace(text, std::regex("\"seq\": 0"), "\"seq\": \"zero\""), "e"),
                    Catch::Contains("e: entry 0 has no integer \"seq\" (found \"zero\")"));
  CHECK_THROWS_WITH(parse_flight_dump(std::regex_replace(text, std::regex("\"rank\": 1"), "\"rank\": 5"), "f"),
                    Catch::Contains("f: rank 5 of world size 3"));
}

TEST_CASE("the desync report names who skipped, who ran another collective and who is silent", "[distributed][flight]") {
  std::map<int, std::optional<FlightDump>> dumps;
  // Rank 1 skipped #1: it has only #0..#1 (its #1 being the others' #2); the others wait in #2.
  dumps[0] = dump_of(0, 3, {{2, {"allreduce(sum)", FlightState::Started}}});
  dumps[1] = dump_of(1, 2);
  dumps[2] = dump_of(2, 3, {{2, {"allreduce(sum)", FlightState::Started}}});
  std::string report = desync_report("g", 2, 0, {0, 1, 2}, dumps, 1500ms);
  CHECK_THAT(report, Catch::StartsWith("desync report (flight recorder) for collective #2 of group g, allreduce(sum) "
                                       "float32[4] on this rank (rank 0): rank(s) 1 never entered it"));
  CHECK_THAT(report, Catch::Contains("\n  rank 1 never entered collective #2: its last is #1 allreduce(sum) float32[4] "
                                     "(finished)"));
  CHECK_THAT(report, Catch::Contains("\n  rank 2 entered #2 too (started)"));
  CHECK(report.find("first differ") == std::string::npos);

  // Rank 2 ran a broadcast as #1; rank 1 sent nothing.
  dumps[0] = dump_of(0, 2, {{1, {"allreduce(sum)", FlightState::Started}}});
  dumps[1] = std::nullopt;
  dumps[2] = dump_of(2, 2, {{1, {"broadcast(root=0)", FlightState::Started}}});
  report = desync_report("g", 1, 0, {0, 1, 2}, dumps, 1500ms);
  CHECK_THAT(report, Catch::Contains("(rank 0): rank(s) 2 entered a different one; rank(s) 1 sent no record"));
  CHECK_THAT(report, Catch::Contains("\n  rank 1 sent no flight record within 1.5 s"));
  CHECK_THAT(report, Catch::Contains("\n  rank 2 entered a different collective as #1: broadcast(root=0) float32[4] "
                                     "(started); this rank: allreduce(sum) float32[4]"));
  CHECK_THAT(report, Catch::Contains("\n  the ranks' records first differ at #1: this rank ran allreduce(sum) float32[4], "
                                     "rank 2 ran broadcast(root=0) float32[4]"));

  // An earlier difference that went by unnoticed (same tag, different op) is the first one named.
  dumps[1] = dump_of(1, 3, {{0, {"allreduce(max)", FlightState::Finished}}, {2, {"allreduce(sum)", FlightState::Started}}});
  dumps[0] = dump_of(0, 3, {{2, {"allreduce(sum)", FlightState::Started}}});
  dumps[2] = dump_of(2, 3, {{2, {"allreduce(sum)", FlightState::Started}}});
  report = desync_report("g", 2, 0, {0, 1, 2}, dumps, 1500ms);
  CHECK_THAT(report, Catch::Contains("every rank entered it with the same arguments: not a desync"));
  CHECK_THAT(report, Catch::Contains("first differ at #0: this rank ran allreduce(sum) float32[4], rank 1 ran "
                                     "allreduce(max) float32[4]"));

  // This rank's own record of #2 gone (out of its ring): the others are placed by how far they got,
  // never called different.
  FlightDump trimmed = dump_of(0, 3);
  trimmed.entries.pop_back();
  dumps[0] = trimmed;
  dumps[1] = dump_of(1, 3);
  dumps[2] = dump_of(2, 2);
  report = desync_report("g", 2, 0, {0, 1, 2}, dumps, 1500ms);
  CHECK_THAT(report, Catch::Contains("(not in this rank's records) on this rank (rank 0): rank(s) 2 never entered it"));
  CHECK_THAT(report, Catch::Contains("rank 1 entered #2 too (finished)"));
  CHECK(report.find("different") == std::string::npos);

  // Members numbered by the job: a group of ranks 3 and 5 reported by rank 5.
  std::map<int, std::optional<FlightDump>> pair;
  pair[3] = dump_of(3, 1);
  pair[5] = dump_of(5, 2, {{1, {"allreduce(sum)", FlightState::Started}}});
  report = desync_report("g", 1, 5, {3, 5}, pair, 1000ms);
  CHECK_THAT(report, Catch::Contains("(rank 5): rank(s) 3 never entered it") &&
                         Catch::Contains("rank 3 never entered collective #1: its last is #0"));
}

TEST_CASE("the table puts the ranks side by side and marks where they part", "[distributed][flight]") {
  const FlightDump a = dump_of(0, 3), b = dump_of(1, 2, {{1, {"broadcast(root=0)", FlightState::Failed}}});
  const std::string table = flight_table({b, a});  // any order: columns by rank
  CHECK_THAT(table, Catch::Contains("group  #  rank 0                                rank 1\n"));
  CHECK_THAT(table, Catch::Contains("g      0  allreduce(sum) float32[4] [finished]  allreduce(sum) float32[4] [finished]\n"));
  CHECK_THAT(table, Catch::Contains("g      1  allreduce(sum) float32[4] [finished]  broadcast(root=0) float32[4] [failed]  "
                                    "<-- ranks differ\n"));
  CHECK_THAT(table, Catch::Contains("g      2  allreduce(sum) float32[4] [finished]  -- not entered"));
  CHECK_THAT(table, Catch::Contains("<-- not every rank entered\n"));
  CHECK_THROWS_WITH(flight_table({a, a}), Catch::Contains("two dumps of rank 0"));
}

TEST_CASE("timed-out ranks exchange records over the store; a rank stuck elsewhere answers through its heartbeat",
          "[distributed][flight]") {
  TCPStore server("127.0.0.1", 0, {.is_server = true});
  auto connect = [&] { return std::make_shared<TCPStore>("127.0.0.1", server.port(), TCPStoreOptions{}); };
  std::vector<std::unique_ptr<FlightRecorder>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<FlightRecorder>(50));
    ranks[r]->set_job(r, 3, FlightExchange{.store = connect(), .connect = {}, .prefix = "flight/1", .id = r, .wait = 20000ms});
  }
  // Every rank ran #0; ranks 0 and 2 are in #1, rank 1 is not.
  Tensor x = zeros({4});
  for (int r = 0; r < 3; ++r) ranks[r]->finish(ranks[r]->issue("default_pg", 0, false, "allreduce(sum)", describe_tensors({x})));
  for (int r : {0, 2}) ranks[r]->start(ranks[r]->issue("default_pg", 1, false, "allreduce(sum)", describe_tensors({x})));
  ::setenv("CHORUS_FLIGHT_RECORDER_FILE", (std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/ex_rank_").c_str(), 1);
  // Rank 1's "heartbeat": answers requests on its own connection until stopped.
  std::atomic<bool> stop{false};
  std::thread heartbeat([&] {
    auto store = connect();
    while (!stop) {
      ranks[1]->answer_request(*store);
      std::this_thread::sleep_for(10ms);
    }
  });
  std::string report2;
  std::thread rank2([&] { report2 = ranks[2]->report_timeout("default_pg", 1, {0, 1, 2}, *ranks[2]->job_exchange()); });
  const std::string report0 = ranks[0]->report_timeout("default_pg", 1, {0, 1, 2}, *ranks[0]->job_exchange());
  rank2.join();
  stop = true;
  heartbeat.join();
  for (const std::string* rep : std::vector<const std::string*>{&report0, &report2}) {
    INFO(*rep);
    CHECK_THAT(*rep, Catch::Contains("rank(s) 1 never entered it") &&
                         Catch::Contains("rank 1 never entered collective #1: its last is #0 allreduce(sum) float32[4] "
                                         "(finished)"));
  }
  CHECK_THAT(report0, Catch::Contains("rank 2 entered #1 too (started)") && Catch::Contains("ex_rank_0.json"));
  // Once per job: a later timeout (the collectives queued behind the first fail at once) points to
  // the first report instead of waiting again.
  const auto again = std::chrono::steady_clock::now();
  CHECK(ranks[0]->report_timeout("group_1", 4, {0, 2}, *ranks[0]->job_exchange()) ==
        "(the desync report is with this job's first timed-out collective, #1 of group default_pg)");
  CHECK(std::chrono::steady_clock::now() - again < 1s);
  CHECK_THAT(report2, Catch::Contains("rank 0 entered #1 too (started)") && Catch::Contains("ex_rank_2.json"));
  // The dump files parse, and rank 1's says why it was written.
  for (int r = 0; r < 3; ++r) {
    std::ifstream in(std::string(std::getenv("CHORUS_FLIGHT_RECORDER_FILE")) + std::to_string(r) + ".json");
    std::stringstream text;
    text << in.rdbuf();
    const FlightDump d = parse_flight_dump(text.str(), "file");
    CHECK(d.rank == r);
    if (r == 1) CHECK_THAT(d.reason, Catch::StartsWith("asked by rank"));
  }
  // Nobody answers within the wait: the report says so instead of waiting for ever.
  FlightRecorder lonely(10);
  lonely.set_job(0, 2, FlightExchange{.store = connect(), .connect = {}, .prefix = "flight/2", .id = 0, .wait = 300ms});
  lonely.start(lonely.issue("default_pg", 0, false, "barrier", ""));
  const auto start = std::chrono::steady_clock::now();
  const std::string alone = lonely.report_timeout("default_pg", 0, {0, 1}, *lonely.job_exchange());
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK_THAT(alone, Catch::Contains("rank(s) 1 sent no record") && Catch::Contains("no flight record within 0."));
  ::unsetenv("CHORUS_FLIGHT_RECORDER_FILE");
}

// Without CHORUS_FLIGHT_RECORDER_FILE a dump goes under $TMPDIR. Bazel sets TMPDIR=/tmp for a test;
// the tests' main() (tests/catch_main.cpp) points it at the test's own scratch folder, so that dumps
// of the tests and of the workers they start do not pile up in /tmp.
TEST_CASE("a dump without CHORUS_FLIGHT_RECORDER_FILE goes to the test's scratch folder", "[distributed][flight]") {
  const char* scratch = std::getenv("TEST_TMPDIR");
  if (scratch == nullptr) {
    std::printf("CHORUS-SKIP: not run by Bazel (no TEST_TMPDIR), so TMPDIR is the caller's\n");
    return;
  }
  REQUIRE(std::getenv("TMPDIR") != nullptr);
  CHECK(std::string(std::getenv("TMPDIR")) == scratch);
  ::unsetenv("CHORUS_FLIGHT_RECORDER_FILE");
  ::unsetenv("MASTER_PORT");
  FlightRecorder recorder(4);
  recorder.start(recorder.issue("default_pg", 0, false, "barrier", ""));
  const std::string path = recorder.write_dump("scratch folder test", 5);
  CHECK(path == std::string(scratch) + "/chorus_flight_rank_5.json");
  std::ifstream in(path);
  CHECK(in.good());
  std::remove(path.c_str());
}

TEST_CASE("timeouts and connections closed by a peer are told apart", "[distributed][flight]") {
  CHECK(is_timeout_error("Timed out waiting 3000ms for recv operation to complete"));
  CHECK(is_timeout_error("Application timeout caused pair closure"));
  CHECK(is_timeout_error("allreduce #3 on sim:0 timed out after 1000 ms"));
  CHECK_FALSE(is_timeout_error("Connection closed by peer [127.0.0.1]:5001"));
  CHECK_FALSE(is_timeout_error("Read error [127.0.0.1]:38842: Connection reset by peer"));
  CHECK(is_peer_closed_error("[./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:42685"));
  CHECK(is_peer_closed_error("Read error [127.0.0.1]:38842: Connection reset by peer"));
  CHECK_FALSE(is_peer_closed_error("Timed out waiting 3000ms for recv operation to complete"));
  CHECK_FALSE(is_peer_closed_error("allreduce #3 on sim:0 timed out after 1000 ms"));
}
