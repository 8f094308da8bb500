// SummaryWriter against an independent reader: every file it writes is decoded by Google's protobuf
// (python3-protobuf, schema tests/utils/tensorboard_subset.proto) with a Python CRC-32C of its own
// (tests/utils/read_tfevents.py), and histograms are checked against PyTorch's algorithm run with
// numpy (tests/utils/numpy_histogram.py). "canonical" in the reader's output means protobuf,
// re-serializing what it decoded, gives the record's exact bytes: the writer encodes as protobuf
// (and so PyTorch) does, field order and proto3 defaults included.
#include "utils/summary_writer.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <latch>
#include <limits>
#include <numeric>
#include <random>
#include <regex>
#include <thread>

#include "tensor/error.h"
#include "tests/utils/tfevents_testing.h"

using namespace chorus::testing;
using chorus::utils::SummaryWriter;
using chorus::utils::SummaryWriterOptions;
using nlohmann::json;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The checks every record of every test passes: protobuf decodes it with no unknown field and
// re-encodes it to the same bytes. (One assertion per file: Catch2 copies every active INFO into
// each assertion's record, which made a dump-carrying check per event quadratic.)
void require_clean(const json& file) {
  INFO(file["message"].get<std::string>());
  REQUIRE(file["crc_error"].is_null());
  REQUIRE(file["truncated"] == false);
  std::string unclean;
  for (const json& e : file["events"]) {
    if (e["canonical"] != true || e["unknown_fields"] != 0) unclean += e.dump() + "\n";
  }
  INFO("events protobuf does not re-encode to the same bytes, or with unknown fields:\n" << unclean);
  CHECK(unclean.empty());
}

void require_file_version_first(const json& file, double before, double after) {
  REQUIRE(file["events"].size() >= 1);
  const json& first = file["events"][0];
  CHECK(first["what"] == "file_version");
  CHECK(first["file_version"] == "brain.Event:2");
  CHECK(first["step"] == 0);
  CHECK(first["wall_time"].get<double>() >= before);
  CHECK(first["wall_time"].get<double>() <= after);
}

// The one summary value of an event.
const json& value_of(const json& event) {
  REQUIRE(event["what"] == "summary");
  REQUIRE(event["values"].size() == 1);
  return event["values"][0];
}

json numpy_histogram(const std::vector<double>& values, const json& bins) {
  const json request = {{"values", values}, {"bins", bins}};
  const CommandResult r =
      run_command(python() + " " + shell_quote(runfile("tests/utils/numpy_histogram.py")), request.dump());
  require_python_dependencies(r, "tests/utils/numpy_histogram.py");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return json::parse(r.out);
}

void require_close(double actual, double expected) {
  INFO("actual " << actual << ", expected " << expected);
  CHECK(std::abs(actual - expected) <= 1e-12 * std::max(1.0, std::abs(expected)));
}

}  // namespace

TEST_CASE("the event file is named as TensorBoard expects and starts with file_version brain.Event:2",
          "[summary_writer]") {
  const std::string dir = scratch_dir("file_version");
  const double before = std::floor(now_seconds());
  SummaryWriter writer(dir);
  const double after = now_seconds();
  const std::string path = writer.event_file_path();
  CHECK(path == only_event_file(dir));

  // tensorboard/summary/writer/event_file_writer.py: events.out.tfevents.%010d.<host>.<pid>.<n>
  const std::string name = fs::path(path).filename().string();
  std::smatch m;
  const std::regex pattern(R"(events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+))");
  REQUIRE(std::regex_match(name, m, pattern));
  CHECK(std::stod(m[1]) >= before);
  CHECK(std::stod(m[1]) <= after);
  CHECK(m[2] == host_name());
  CHECK(std::stol(m[3]) == ::getpid());

  // Written and flushed by the constructor, before any add_*.
  const json file = read_tfevents(path);
  require_clean(file);
  REQUIRE(file["records"] == 1);
  require_file_version_first(file, before, after);
}

TEST_CASE("add_scalar: tags, steps and float32 values as protobuf decodes them", "[summary_writer]") {
  const std::string dir = scratch_dir("scalars");
  struct Point {
    std::string tag;
    double value;
    int64_t step;
  };
  // 0.0 (a oneof member: written although it is proto3's default), -0.0, values float32 rounds,
  // a float32 subnormal, a step past 32 bits and a negative one (a 10-byte varint).
  const std::vector<Point> points = {
      {"loss/train", 0.0, 0},        {"loss/train", 2.5, 1},           {"loss/train", 0.1, 2},
      {"accuracy", -0.0, 3},         {"accuracy", 3.141592653589793, int64_t{1} << 40},
      {"tiny", 1e-40, 5},            {"big", 1e10, -3},                {"ümlaut ✓/x", -1.5, 7},
  };
  const double before = now_seconds();
  {
    SummaryWriter writer(dir);
    for (const auto& p : points) writer.add_scalar(p.tag, p.value, p.step);
    writer.add_scalar("walltime", 1.0, 9, 1234567890.25);
  }
  const double after = now_seconds();

  const json file = read_tfevents(only_event_file(dir));
  require_clean(file);
  require_file_version_first(file, before, after);
  REQUIRE(file["events"].size() == points.size() + 2);
  for (size_t i = 0; i < points.size(); ++i) {
    const json& e = file["events"][i + 1];
    INFO("point " << i << ": " << e.dump());
    const json& v = value_of(e);
    CHECK(v["tag"] == points[i].tag);
    CHECK(v["kind"] == "simple_value");
    CHECK(v["simple_value"].get<double>() == as_float32(points[i].value));
    CHECK(std::signbit(v["simple_value"].get<double>()) == std::signbit(points[i].value));
    CHECK(e["step"].get<int64_t>() == points[i].step);
    CHECK(e["wall_time"].get<double>() >= before);
    CHECK(e["wall_time"].get<double>() <= after);
    CHECK(v.find("metadata") == v.end());  // PyTorch's scalars carry no plugin metadata
  }
  const json& last = file["events"].back();
  CHECK(last["wall_time"].get<double>() == 1234567890.25);
  CHECK(last["step"] == 9);
}

TEST_CASE("add_scalars writes each key to a sub-run <log_dir>/<main_tag>_<key> under the tag main_tag",
          "[summary_writer]") {
  const std::string dir = scratch_dir("add_scalars");
  {
    SummaryWriter writer(dir);
    writer.add_scalars("loss/total", {{"train", 1.25}, {"val", 2.5}}, 3);
    writer.add_scalars("loss/total", {{"train", 0.75}, {"val", 2.0}}, 4, 99.5);
  }
  // The log_dir's own file holds the file_version record only.
  CHECK(read_tfevents(only_event_file(dir))["records"] == 1);
  const std::map<std::string, std::vector<double>> expected = {{"train", {1.25, 0.75}}, {"val", {2.5, 2.0}}};
  for (const auto& [key, values] : expected) {
    const std::string sub = dir + "/loss_total_" + key;  // '/' in main_tag becomes '_'
    REQUIRE(fs::is_directory(sub));
    const json file = read_tfevents(only_event_file(sub));
    require_clean(file);
    REQUIRE(file["events"].size() == 3);
    CHECK(file["events"][0]["file_version"] == "brain.Event:2");
    for (size_t i = 0; i < 2; ++i) {
      const json& e = file["events"][i + 1];
      CHECK(value_of(e)["tag"] == "loss/total");
      CHECK(value_of(e)["simple_value"].get<double>() == as_float32(values[i]));
      CHECK(e["step"] == 3 + static_cast<int>(i));
    }
    CHECK(file["events"][2]["wall_time"].get<double>() == 99.5);
  }
}

TEST_CASE("add_histogram logs PyTorch's bins='tensorflow' histogram (numpy oracle)", "[summary_writer][histogram]") {
  std::mt19937_64 rng(1234);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> gaussian(1000);
  for (double& x : gaussian) x = normal(rng);
  std::vector<double> positive(300);
  for (double& x : positive) x = 1000.0 + 50.0 * normal(rng);

  struct Case {
    std::string name;
    std::vector<double> values;
    bool exact_sums;  // every partial sum is exact in double, so the sums must match bit for bit
  };
  const std::vector<Case> cases = {
      // 0 lands in [0, 1e-12); a value equal to an edge goes to the bucket it starts.
      {"small", {-3.0, -0.5, 0.0, 0.0, 0.25, 1.0, 1.0, 2.5}, true},
      {"on edges", {-1e-12, 0.0, 1e-12, 1.1000000000000002e-12}, false},
      {"one value", {42.0}, true},
      {"all zero", {0.0, 0.0, 0.0}, true},
      {"gaussian", gaussian, false},
      {"positive only", positive, false},
      // Past the last edge (~9.92e19): out of the buckets, still in min/max/num/sum.
      {"beyond the edges", {1.0, 2.0, 1e20}, true},
  };
  const std::string dir = scratch_dir("histogram");
  {
    SummaryWriter writer(dir);
    for (size_t i = 0; i < cases.size(); ++i) writer.add_histogram(cases[i].name, cases[i].values, static_cast<int64_t>(i));
  }
  const json file = read_tfevents(only_event_file(dir));
  require_clean(file);
  REQUIRE(file["events"].size() == cases.size() + 1);
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << cases[i].name);
    const json& v = value_of(file["events"][i + 1]);
    CHECK(v["tag"] == cases[i].name);
    REQUIRE(v["kind"] == "histo");
    const json& h = v["histo"];
    const json expected = numpy_histogram(cases[i].values, "tensorflow");
    CHECK(h["min"] == expected["min"]);
    CHECK(h["max"] == expected["max"]);
    CHECK(h["num"] == expected["num"]);
    CHECK(h["bucket_limit"] == expected["bucket_limit"]);
    CHECK(h["bucket"] == expected["bucket"]);
    if (cases[i].exact_sums) {
      CHECK(h["sum"] == expected["sum"]);
      CHECK(h["sum_squares"] == expected["sum_squares"]);
    } else {  // numpy sums pairwise, chorus in order
      require_close(h["sum"].get<double>(), expected["sum"].get<double>());
      require_close(h["sum_squares"].get<double>(), expected["sum_squares"].get<double>());
    }
    // Right edges only, one count each, and every value inside the edges counted once.
    CHECK(h["bucket"].size() == h["bucket_limit"].size());
  }
}

TEST_CASE("add_histogram with explicit bin edges matches numpy.histogram's buckets", "[summary_writer][histogram]") {
  const std::vector<double> edges = {0.0, 1.0, 2.0, 3.0, 4.0};
  // The first bucket non-empty (PyTorch adds a zero bucket at the left edge), the last edge closed,
  // values outside the edges, the middle buckets only.
  const std::vector<std::vector<double>> cases = {{0.5, 3.0, 4.0}, {-1.0, 1.5, 2.5, 2.5, 9.0}, {2.0}};
  const std::string dir = scratch_dir("histogram_bins");
  {
    SummaryWriter writer(dir);
    for (size_t i = 0; i < cases.size(); ++i) writer.add_histogram("h", cases[i], static_cast<int64_t>(i), edges);
  }
  const json file = read_tfevents(only_event_file(dir));
  require_clean(file);
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& h = value_of(file["events"][i + 1])["histo"];
    const json expected = numpy_histogram(cases[i], edges);
    INFO("case " << i << ": " << h.dump() << " expected " << expected.dump());
    CHECK(h["bucket_limit"] == expected["bucket_limit"]);
    CHECK(h["bucket"] == expected["bucket"]);
    CHECK(h["min"] == expected["min"]);
    CHECK(h["max"] == expected["max"]);
    CHECK(h["num"] == expected["num"]);
    CHECK(h["sum"] == expected["sum"]);
    CHECK(h["sum_squares"] == expected["sum_squares"]);
  }
}

TEST_CASE("add_histogram rejects what PyTorch cannot histogram", "[summary_writer][histogram]") {
  SummaryWriter writer(scratch_dir("histogram_errors"));
  const std::vector<double> empty;
  CHECK_THROWS_WITH(writer.add_histogram("h", empty), Catch::Contains("no values"));
  const std::vector<double> nan = {1.0, std::numeric_limits<double>::quiet_NaN()};
  CHECK_THROWS_WITH(writer.add_histogram("h", nan), Catch::Contains("value 1 is nan"));
  const std::vector<double> inf = {std::numeric_limits<double>::infinity()};
  CHECK_THROWS_AS(writer.add_histogram("h", inf), chorus::Error);
  const std::vector<double> outside = {5.0};
  const std::vector<double> edges = {0.0, 1.0};
  CHECK_THROWS_WITH(writer.add_histogram("h", outside, 0, edges), Catch::Contains("none of the 1 values"));
  const std::vector<double> decreasing = {1.0, 0.0};
  CHECK_THROWS_WITH(writer.add_histogram("h", outside, 0, decreasing), Catch::Contains("must not decrease"));
}

TEST_CASE("add_text writes the text plugin's DT_STRING tensor of shape [1], as PyTorch", "[summary_writer]") {
  const std::string dir = scratch_dir("text");
  const std::string text = "# Notes\nlr = 0.1, ümlaut ✓";
  {
    SummaryWriter writer(dir);
    writer.add_text("notes", text, 5);
    writer.add_text("empty", "", 6);
  }
  const json file = read_tfevents(only_event_file(dir));
  require_clean(file);
  REQUIRE(file["events"].size() == 3);
  const std::vector<std::pair<std::string, std::string>> expected = {{"notes", text}, {"empty", ""}};
  for (size_t i = 0; i < expected.size(); ++i) {
    const json& e = file["events"][i + 1];
    const json& v = value_of(e);
    INFO(v.dump());
    CHECK(v["tag"] == expected[i].first + "/text_summary");
    REQUIRE(v["kind"] == "tensor");
    CHECK(v["tensor"]["dtype"] == "DT_STRING");
    CHECK(v["tensor"]["shape"] == json::array({1}));
    CHECK(v["tensor"]["string_val"] == json::array({expected[i].second}));
    CHECK(v["metadata"]["plugin_name"] == "text");
    CHECK(v["metadata"]["content_hex"] == "");  // TextPluginData(version=0): empty in proto3
    CHECK(v["metadata"]["text"]["version"] == 0);
    CHECK(e["step"] == 5 + static_cast<int>(i));
  }
}

TEST_CASE("add_hparams writes the hparams plugin's experiment, session start and end, then the metrics, in a sub-run",
          "[summary_writer][hparams]") {
  const std::string dir = scratch_dir("hparams");
  const double before = now_seconds();
  {
    SummaryWriter writer(dir);
    writer.add_hparams({{"lr", 0.01}, {"batch", 32}, {"optimizer", "adam"}, {"nesterov", true}, {"zero", 0.0}},
                       {{"hparam/accuracy", 0.875}, {"hparam/loss", 0.25}}, "trial1", 7);
    writer.add_hparams({{"lr", 0.1}}, {{"hparam/accuracy", 0.5}});  // run name: the Unix time
  }
  const double after = now_seconds();
  CHECK(read_tfevents(only_event_file(dir))["records"] == 1);

  const json file = read_tfevents(only_event_file(dir + "/trial1"));
  require_clean(file);
  REQUIRE(file["events"].size() == 6);
  const std::vector<std::string> tags = {"_hparams_/experiment", "_hparams_/session_start_info",
                                         "_hparams_/session_end_info"};
  for (size_t i = 0; i < 3; ++i) {
    const json& e = file["events"][i + 1];
    const json& v = value_of(e);
    INFO(v.dump());
    CHECK(v["tag"] == tags[i]);
    CHECK(v["kind"].is_null());  // metadata only, as PyTorch
    CHECK(e["step"] == 7);
    REQUIRE(v["metadata"]["plugin_name"] == "hparams");
    const json& content = v["metadata"]["hparams"];
    CHECK(content["version"] == 0);
    CHECK(content["canonical"] == true);
    CHECK(content["unknown_fields"] == 0);
  }
  const json& experiment = value_of(file["events"][1])["metadata"]["hparams"];
  CHECK(experiment["data"] == "experiment");
  CHECK(experiment["experiment"]["hparam_infos"] == json::parse(R"([
      {"name": "batch", "type": "DATA_TYPE_FLOAT64"}, {"name": "lr", "type": "DATA_TYPE_FLOAT64"},
      {"name": "nesterov", "type": "DATA_TYPE_BOOL"}, {"name": "optimizer", "type": "DATA_TYPE_STRING"},
      {"name": "zero", "type": "DATA_TYPE_FLOAT64"}])"));
  CHECK(experiment["experiment"]["metric_infos"] == json::parse(R"([
      {"group": "", "tag": "hparam/accuracy"}, {"group": "", "tag": "hparam/loss"}])"));

  const json& start = value_of(file["events"][2])["metadata"]["hparams"];
  CHECK(start["data"] == "session_start_info");
  CHECK(start["session_start_info"]["hparams"] == json::parse(R"({
      "batch": {"number_value": 32.0}, "lr": {"number_value": 0.01}, "nesterov": {"bool_value": true},
      "optimizer": {"string_value": "adam"}, "zero": {"number_value": 0.0}})"));

  const json& end = value_of(file["events"][3])["metadata"]["hparams"];
  CHECK(end["data"] == "session_end_info");
  CHECK(end["session_end_info"]["status"] == "STATUS_SUCCESS");

  CHECK(value_of(file["events"][4])["tag"] == "hparam/accuracy");
  CHECK(value_of(file["events"][4])["simple_value"].get<double>() == as_float32(0.875));
  CHECK(value_of(file["events"][5])["tag"] == "hparam/loss");
  CHECK(value_of(file["events"][5])["simple_value"].get<double>() == as_float32(0.25));
  CHECK(file["events"][5]["step"] == 7);

  // The second call's run is named by the time, as PyTorch's str(time.time()).
  std::vector<std::string> runs;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory() && entry.path().filename() != "trial1") runs.push_back(entry.path().filename().string());
  }
  REQUIRE(runs.size() == 1);
  INFO("run name " << runs[0]);
  REQUIRE(std::regex_match(runs[0], std::regex(R"(\d{10}\.\d+)")));
  CHECK(std::stod(runs[0]) >= before);
  CHECK(std::stod(runs[0]) <= after);
  const json timed = read_tfevents(only_event_file(dir + "/" + runs[0]));
  require_clean(timed);
  CHECK(timed["records"] == 5);
}

TEST_CASE("records are buffered up to max_queue; flush, close and the destructor write them", "[summary_writer]") {
  const std::string dir = scratch_dir("flush");
  std::string path;
  {
    SummaryWriter writer(dir, SummaryWriterOptions{.max_queue = 1000, .flush_secs = 1e9});
    path = writer.event_file_path();
    for (int i = 0; i < 5; ++i) writer.add_scalar("x", i, i);
    CHECK(read_tfevents(path)["records"] == 1);  // still buffered
    writer.flush();
    CHECK(read_tfevents(path)["records"] == 6);
    writer.add_scalar("x", 5, 5);
    writer.add_scalar("x", 6, 6);
  }  // the destructor closes
  const json file = read_tfevents(path);
  require_clean(file);
  CHECK(file["records"] == 8);

  // A full queue is written without a flush.
  const std::string dir2 = scratch_dir("flush_queue");
  SummaryWriter writer(dir2, SummaryWriterOptions{.max_queue = 3, .flush_secs = 1e9});
  for (int i = 0; i < 3; ++i) writer.add_scalar("x", i, i);
  CHECK(read_tfevents(writer.event_file_path())["records"] == 4);
  // flush_secs: a record arriving that long after the oldest buffered one writes the buffer.
  const std::string dir3 = scratch_dir("flush_secs");
  SummaryWriter timed(dir3, SummaryWriterOptions{.max_queue = 1000, .flush_secs = 0});
  timed.add_scalar("x", 1, 1);
  CHECK(read_tfevents(timed.event_file_path())["records"] == 2);

  // After close(), the next add opens a new file, as PyTorch's writer does.
  writer.close();
  writer.add_scalar("after", 1.0, 1);
  writer.flush();
  const std::vector<std::string> files = event_files(dir2);
  REQUIRE(files.size() == 2);
  std::vector<int> records = {read_tfevents(files[0])["records"].get<int>(), read_tfevents(files[1])["records"].get<int>()};
  std::sort(records.begin(), records.end());
  CHECK(records == std::vector<int>{2, 4});
}

TEST_CASE("add_scalar from several threads at once: every record lands whole", "[summary_writer]") {
  const std::string dir = scratch_dir("threads");
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  {
    SummaryWriter writer(dir, SummaryWriterOptions{.max_queue = 7});
    std::latch start(kThreads);  // all threads add at once, so their calls overlap
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&writer, &start, t] {
        start.arrive_and_wait();
        for (int i = 0; i < kPerThread; ++i) writer.add_scalar("thread" + std::to_string(t), i * 0.5, i);
      });
    }
    for (auto& th : threads) th.join();
  }
  const json file = read_tfevents(only_event_file(dir));
  require_clean(file);
  REQUIRE(file["records"] == 1 + kThreads * kPerThread);
  // Checked in plain loops, asserted once: 8000 Catch2 assertions would dominate the run.
  std::map<std::string, std::vector<int64_t>> steps;
  int wrong_values = 0;
  for (size_t i = 1; i < file["events"].size(); ++i) {
    const json& e = file["events"][i];
    const json& v = e["values"][0];
    if (v["simple_value"].get<double>() != e["step"].get<double>() * 0.5) ++wrong_values;
    steps[v["tag"].get<std::string>()].push_back(e["step"].get<int64_t>());
  }
  CHECK(wrong_values == 0);
  REQUIRE(steps.size() == kThreads);
  std::vector<int64_t> in_order(kPerThread);
  std::iota(in_order.begin(), in_order.end(), 0);
  for (auto& [tag, s] : steps) {
    INFO(tag);
    CHECK(s == in_order);  // each thread's records whole and in its order
  }
}

TEST_CASE("an unusable log_dir is a chorus::Error naming the path and the OS's reason", "[summary_writer][errors]") {
  const std::string dir = scratch_dir("unwritable");
  const std::string regular_file = dir + "/not_a_dir";
  write_file(regular_file, "x");
  const std::string under_file = regular_file + "/run1";
  try {
    SummaryWriter writer(under_file);
    FAIL("no error for a log_dir under a regular file");
  } catch (const chorus::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("'" + under_file + "'") != std::string::npos);
    CHECK(what.find("Not a directory") != std::string::npos);
  }
  try {
    SummaryWriter writer(regular_file);  // the log_dir is itself a file
    FAIL("no error for a log_dir that is a regular file");
  } catch (const chorus::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("'" + regular_file + "'") != std::string::npos);
  }
}

TEST_CASE("the default log_dir is runs/<Mon><DD>_<HH>-<MM>-<SS>_<hostname><comment>", "[summary_writer]") {
  const std::string dir = scratch_dir("default_dir");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  std::string log_dir;
  try {
    SummaryWriter writer("", SummaryWriterOptions{.comment = "_lr0.1"});
    log_dir = writer.get_logdir();
  } catch (...) {
    fs::current_path(cwd);
    throw;
  }
  fs::current_path(cwd);
  INFO(log_dir);
  CHECK(std::regex_match(log_dir, std::regex(R"(runs/[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_)" +
                                             std::regex_replace(host_name(), std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                                             "_lr0\\.1")));
  CHECK(event_files(dir + "/" + log_dir).size() == 1);
}
