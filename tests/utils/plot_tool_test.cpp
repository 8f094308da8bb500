// tools/plot.py as a user runs it on SummaryWriter's runs: --dump gives back the scalars written
// (sub-runs of add_scalars and add_hparams included, other summaries ignored), -o draws a PNG, a
// truncated last record is skipped and a corrupted one is an error.
#include <catch2/catch.hpp>
#include <functional>

#include "tests/utils/tfevents_testing.h"
#include "utils/summary_writer.h"

using namespace chorus::testing;
using chorus::utils::SummaryWriter;
using nlohmann::json;

namespace {

CommandResult plot(const std::string& args) {
  const CommandResult r = run_command(python() + " " + shell_quote(runfile("tools/plot.py")) + " " + args);
  require_python_dependencies(r, "tools/plot.py");
  return r;
}

// Two runs: exp1 with two tags, an add_scalars pair and non-scalar summaries; exp2 with one tag.
void write_runs(const std::string& root) {
  SummaryWriter exp1(root + "/exp1");
  for (int step = 0; step < 10; ++step) {
    exp1.add_scalar("loss", 1.0 / (step + 1), step);
    exp1.add_scalar("accuracy", 0.1 * step, step);
    exp1.add_scalars("lr", {{"a", 0.01 * step}, {"b", -0.5 * step}}, step);
  }
  exp1.add_histogram("weights", std::vector<double>{1.0, 2.0, 3.0}, 0);
  exp1.add_text("notes", "not a scalar", 0);
  SummaryWriter exp2(root + "/exp2");
  for (int step = 0; step < 5; ++step) exp2.add_scalar("loss", 2.0 / (step + 1), step * 10);
}

json points(int n, int step_scale, const std::function<double(int)>& f) {
  json out = json::array();
  for (int i = 0; i < n; ++i) out.push_back({i * step_scale, as_float32(f(i))});
  return out;
}

}  // namespace

TEST_CASE("plot.py --dump gives back the scalars SummaryWriter wrote, sub-runs included", "[plot_tool]") {
  const std::string root = scratch_dir("plot_dump");
  write_runs(root);
  const CommandResult r = plot("--dump " + shell_quote(root + "/exp1") + " " + shell_quote(root + "/exp2"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json dump = json::parse(r.out);
  const json expected = {
      {"exp1", {{"loss", points(10, 1, [](int s) { return 1.0 / (s + 1); })},
                {"accuracy", points(10, 1, [](int s) { return 0.1 * s; })}}},
      {"exp1/lr_a", {{"lr", points(10, 1, [](int s) { return 0.01 * s; })}}},
      {"exp1/lr_b", {{"lr", points(10, 1, [](int s) { return -0.5 * s; })}}},
      {"exp2", {{"loss", points(5, 10, [](int s) { return 2.0 / (s + 1); })}}},
  };
  CHECK(dump == expected);

  const CommandResult only = plot("--dump --tags loss " + shell_quote(root + "/exp1") + " " + shell_quote(root + "/exp2"));
  REQUIRE(only.exit_code == 0);
  CHECK(json::parse(only.out) == json{{"exp1", {{"loss", expected["exp1"]["loss"]}}}, {"exp2", expected["exp2"]}});
}

TEST_CASE("plot.py -o draws the curves into a PNG", "[plot_tool]") {
  const std::string root = scratch_dir("plot_png");
  write_runs(root);
  const std::string png = root + "/curves.png";
  const CommandResult r = plot(shell_quote(root + "/exp1") + " " + shell_quote(root + "/exp2") + " -o " + shell_quote(png));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string bytes = read_file(png);
  CHECK(bytes.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  CHECK(bytes.size() > 20000);  // three subplots with lines, axes and legends; an empty figure is ~5 kB
}

TEST_CASE("plot.py skips a truncated last record and stops at a CRC mismatch", "[plot_tool]") {
  const std::string root = scratch_dir("plot_damaged");
  std::string path;
  {
    SummaryWriter writer(root + "/run");
    for (int step = 0; step < 3; ++step) writer.add_scalar("loss", step + 0.5, step);
    path = writer.event_file_path();
  }
  const std::string bytes = read_file(path);
  write_file(path, bytes.substr(0, bytes.size() - 3));
  const CommandResult cut = plot("--dump " + shell_quote(root + "/run"));
  INFO(cut.err);
  REQUIRE(cut.exit_code == 0);
  CHECK(json::parse(cut.out) == json{{"run", {{"loss", json::array({{0, 0.5}, {1, 1.5}})}}}});
  CHECK(cut.err.find("truncated") != std::string::npos);

  std::string damaged = bytes;
  damaged[bytes.size() - 10] ^= 0x01;
  write_file(path, damaged);
  const CommandResult bad = plot("--dump " + shell_quote(root + "/run"));
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("CRC mismatch") != std::string::npos);
  CHECK(bad.err.find(path) != std::string::npos);
}
