// Checkpoint atomicity under kill -9: a writer saving one checkpoint over and over is killed with
// SIGKILL at random moments, 200 times. After every kill the checkpoint at the path is either absent
// (killed before its first save) or a whole generation: it loads (the CRC-32C of every tensor checks
// out), and every tensor, the step and the metadata name one and the same generation; once written it
// never disappears. Temporaries of killed writers do not pile up: the next save removes them.
#include <catch2/catch.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "nn/serialize.h"
#include "tensor/ops.h"

using namespace chorus;
namespace fs = std::filesystem;

namespace {

std::string writer() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return (srcdir ? std::string(srcdir) + "/chorus/" : std::string("bazel-bin/")) + "tests/nn/checkpoint_writer";
}

int temporaries(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().find(".tmp.") != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("a checkpoint killed mid-save is the previous whole one or absent, never torn (200 kills)",
          "[nn][checkpoint][faults]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(tmp ? tmp : "/tmp") / ("ckpt_kill_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "checkpoint.safetensors").string();
  std::mt19937 rng(2026);
  std::uniform_int_distribution<int> delay_us(0, 60000);
  int64_t last_generation = 0;
  int absent = 0, loaded = 0, max_temporaries = 0, mid_save = 0;
  const int trials = 200;
  for (int trial = 0; trial < trials; ++trial) {
    // Odd trials kill at a random moment after the writer started (possibly before its first save);
    // even ones after its first save is complete (its "saved" line), so most kills hit the saves
    // that replace an existing checkpoint, however long the program takes to start here.
    int out[2];
    REQUIRE(::pipe(out) == 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      ::execl(writer().c_str(), "checkpoint_writer", path.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(out[1]);
    if (trial % 2 == 0) {
      pollfd p{out[0], POLLIN, 0};
      REQUIRE(::poll(&p, 1, 30000) == 1);  // the first save is done
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    INFO("trial " << trial);
    ::close(out[0]);
    REQUIRE(WIFSIGNALED(status));  // killed while still saving, not ended some other way
    const int left = temporaries(dir);  // a temporary left: this kill landed inside a save
    mid_save += left > 0;
    max_temporaries = std::max(max_temporaries, left);
    if (!fs::exists(path)) {
      REQUIRE(last_generation == 0);  // once written, the checkpoint never disappears
      ++absent;
      continue;
    }
    const nn::Checkpoint c = nn::Checkpoint::load(path);  // throws on a torn or corrupt file
    const int64_t g = c.step;
    REQUIRE(g >= 1);
    REQUIRE(c.epoch == g);
    REQUIRE(c.extra.at("generation") == std::to_string(g));
    REQUIRE(c.model.size() == 4);
    for (const auto& [name, t] : c.model) {
      REQUIRE(t.min().item<float>() == static_cast<float>(g));
      REQUIRE(t.max().item<float>() == static_cast<float>(g));
    }
    REQUIRE(c.optimizer.at(0).second.item<double>() == static_cast<double>(g));
    last_generation = g;
    ++loaded;
  }
  // Killed writers leave at most their one temporary; each next writer's first save removes them.
  CHECK(max_temporaries <= 1);
  std::printf("%d kills: %d before the first save, %d left a whole checkpoint, %d landed inside a save (a temporary "
              "left); at most %d temporary at once\n", trials, absent, loaded, mid_save, max_temporaries);
  CHECK(loaded >= trials / 2);  // every even trial at least
  // The kills do hit saves in progress (135 of 200 on a quiet machine, 6 under CI's load with the
  // first version of the writer): at least one, or the test checked nothing.
  CHECK(mid_save >= 1);
}
