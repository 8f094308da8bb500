// The main() of every chorus test binary, compiled once (see //tests:catch_main).
// Kept alone in its file because this one translation unit costs 12-29 s to compile.
//
// Two things beyond Catch2's own main():
// - A listener prints one line as each test case starts and one as it ends:
//     CHORUS-CASE start <name>
//     CHORUS-CASE passed|failed <name>
//   tools/test.sh reads these from the test logs to count each test case once across its phases
//   (opt, ThreadSanitizer, ASan+UBSan, the ISA reruns): a case that failed in any phase counts as
//   failed; a "CHORUS-SKIP: why" line between a case's start and end makes it skipped. A case that
//   started and never ended (crash, timeout, sanitizer abort) is named by its start line.
// - Bazel's test sharding (shard_count on a target; Catch2 v2 has none of its own): with
//   TEST_TOTAL_SHARDS = n and TEST_SHARD_INDEX = k, this binary runs the k-th, (k+n)-th, ... of the
//   cases it would otherwise run, in declaration order, so the shards run each case exactly once.
// - TMPDIR: Bazel gives a test its own scratch folder (TEST_TMPDIR, removed after the test) but sets
//   TMPDIR=/tmp, so what chorus writes under $TMPDIR (the flight recorder's dumps, chorusrun's token
//   folder), from the test and from the worker processes it starts, went to /tmp and stayed there
//   (194 flight-recorder dumps after a day of runs). Where TEST_TMPDIR is set, TMPDIR is set to it
//   before any case runs; the workers inherit it.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

int cases_started = 0;

struct CaseLines : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    ++cases_started;
    line("start", info.name);
  }

  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    // Catch counts a case failed when any of its assertions failed (an unexpected exception and a
    // fatal signal included); [!shouldfail] cases that failed count as passed ("failedButOk").
    line(stats.totals.testCases.failed > 0 ? "failed" : "passed", stats.testInfo.name);
  }

  // Through C stdio, flushed at once: test code prints CHORUS-SKIP lines with printf, and the order
  // of the lines in the log is what ties a skip to its case. std::cout shares stdio's buffer
  // (sync_with_stdio is on), so Catch's own output keeps its place too.
  static void line(const char* what, const std::string& name) {
    std::fflush(stdout);
    std::printf("\nCHORUS-CASE %s %s\n", what, name.c_str());
    std::fflush(stdout);
  }
};

// A test case's name as a Catch2 test spec that matches exactly that name: every character the
// spec parser treats specially is escaped.
std::string exact_spec(const std::string& name) {
  std::string spec;
  for (char c : name) {
    if (c == '\\' || c == ',' || c == '[' || c == ']' || c == '"' || c == '*' || c == '~' || c == '^') spec += '\\';
    spec += c;
  }
  return spec;
}

}  // namespace

CATCH_REGISTER_LISTENER(CaseLines)

int main(int argc, char* argv[]) {
  if (const char* scratch = std::getenv("TEST_TMPDIR"); scratch != nullptr && *scratch != '\0')
    ::setenv("TMPDIR", scratch, 1);
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const char* total_env = std::getenv("TEST_TOTAL_SHARDS");
  const char* index_env = std::getenv("TEST_SHARD_INDEX");
  const int total = total_env ? std::atoi(total_env) : 1;
  if (total > 1 && index_env != nullptr) {
    // Tell Bazel this binary shards (it fails a sharded test that does not touch this file).
    if (const char* status = std::getenv("TEST_SHARD_STATUS_FILE")) {
      if (std::FILE* f = std::fopen(status, "w")) std::fclose(f);
    }
    const int index = std::atoi(index_env);
    const Catch::IConfig& config = session.config();
    const std::vector<Catch::TestCase> cases =
        Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config);
    // One spec, the names joined by "," (Catch's "or"; separate strings would be concatenated).
    std::string spec;
    int mine = 0;
    for (size_t i = static_cast<size_t>(index); i < cases.size(); i += static_cast<size_t>(total)) {
      spec += (spec.empty() ? "" : ",") + exact_spec(cases[i].name);
      ++mine;
    }
    std::printf("shard %d of %d: %d of %zu test cases\n", index + 1, total, mine, cases.size());
    // A shard with no case of its own passes with nothing run (more shards than cases).
    if (mine == 0) return 0;
    Catch::ConfigData data = session.configData();
    data.testsOrTags = {spec};
    session.useConfigData(data);
    const int rc = session.run();
    if (cases_started != mine) {
      std::printf("catch_main: shard %d of %d ran %d test cases, expected %d: the shard's test spec is wrong\n",
                  index + 1, total, cases_started, mine);
      return 1;
    }
    return rc;
  }
  return session.run();
}
