// chorus::cli::refuse_non_finite (utils/cli.h): every floating-point option refuses NaN and the
// infinities, including where CLI11's own numeric checks let them through (PositiveNumber,
// NonNegativeNumber and Range compare with < and >, false for NaN; PositiveNumber takes inf).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "utils/cli.h"

namespace {

// Parses `args` (after the program name) into a fresh app; returns CLI11's error text, or "" on success.
struct Parsed {
  double lr = 0.1, decay = 0.0, warmup = 0.5;
  std::vector<double> betas;
  int steps = 1;
  double sub_scale = 1.0;
  std::string error;
};

Parsed parse(std::vector<std::string> args) {
  Parsed p;
  CLI::App app("cli_test");
  app.add_option("--lr", p.lr)->check(CLI::PositiveNumber);
  app.add_option("--decay", p.decay)->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", p.warmup)->check(CLI::Range(0.0, 1.0));
  app.add_option("--betas", p.betas);  // no check of its own
  app.add_option("--steps", p.steps)->check(CLI::PositiveNumber);
  CLI::App* sub = app.add_subcommand("scale");
  sub->add_option("--by", p.sub_scale);
  chorus::cli::refuse_non_finite(app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    p.error = e.what();
  }
  return p;
}

}  // namespace

TEST_CASE("refuse_non_finite: NaN and infinities are refused on every floating-point option, with the flag and value named",
          "[utils][cli]") {
  // Without it, CLI11 2.1 takes these (the defect this guards against): a control on a plain app.
  // Its PositiveNumber and Range refuse an infinity ("not in range") but not NaN; an option without
  // a check takes both.
  {
    double lr = 0.1;
    std::vector<double> betas;
    CLI::App app("control");
    app.add_option("--lr", lr)->check(CLI::PositiveNumber);
    app.add_option("--betas", betas);
    std::vector<std::string> args = {"inf", "--betas", "nan", "--lr"};
    REQUIRE_NOTHROW(app.parse(args));
    CHECK(std::isnan(lr));
    REQUIRE(betas.size() == 1u);
    CHECK(std::isinf(betas[0]));
  }
  for (const std::string flag : {"--lr", "--decay", "--warmup", "--betas"}) {
    for (const std::string value : {"nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e400"}) {
      INFO(flag << " " << value);
      const Parsed p = parse({flag, value});
      CHECK(p.error.find(flag) != std::string::npos);
      // NaN always reaches this check; an infinity may be refused first by the option's own range.
      const bool ours = p.error.find("expected a finite number, got '" + value + "'") != std::string::npos;
      if (value.find_first_of("nN") == 0) CHECK(ours);
      else CHECK((ours || p.error.find("not in range") != std::string::npos));
      if (flag == "--betas") CHECK(ours);  // no check of its own: only this one refuses it
    }
  }
  // One bad element of a list is enough.
  CHECK(parse({"--betas", "0.9", "nan"}).error.find("got 'nan'") != std::string::npos);
  // Options of subcommands too.
  CHECK(parse({"scale", "--by", "inf"}).error.find("got 'inf'") != std::string::npos);
}

TEST_CASE("refuse_non_finite: finite values, the options' own checks and integer options are as before", "[utils][cli]") {
  Parsed p = parse({"--lr", "2.5e-4", "--decay", "0", "--warmup", "1", "--betas", "0.9", "0.999", "--steps", "7"});
  CHECK(p.error.empty());
  CHECK(p.lr == 2.5e-4);
  CHECK(p.decay == 0.0);
  CHECK(p.warmup == 1.0);
  CHECK(p.betas == std::vector<double>{0.9, 0.999});
  CHECK(p.steps == 7);
  // The options' own checks still speak for themselves.
  CHECK(parse({"--lr", "-5"}).error.find("not in range") != std::string::npos);
  CHECK(parse({"--warmup", "2"}).error.find("not in range") != std::string::npos);
  // Not a number at all: the conversion refuses it, as before.
  const std::string word = parse({"--lr", "fast"}).error;
  CHECK(!word.empty());
  CHECK(word.find("finite") == std::string::npos);
  // Integer options are not floating-point options: "nan" fails their conversion as it always did.
  CHECK(!parse({"--steps", "nan"}).error.empty());
}
