// Command-line checks every chorus program applies to its CLI11 options. CLI11's numeric checks
// (PositiveNumber, NonNegativeNumber, Range) compare with < and >, which NaN passes, and
// PositiveNumber takes infinity: `--lr nan` was accepted, and where a program read a non-positive
// value as "use the default", it silently trained with the default.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <string>

namespace chorus::cli {

// Refuses a value that reads as NaN or an infinity ("nan", "inf", "-Infinity", "1e999", which
// overflows). Text that is not a number at all is left to the option's own conversion to refuse.
inline CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        const char* begin = value.c_str();
        char* end = nullptr;
        const double v = std::strtod(begin, &end);
        if (end == begin) return {};
        if (!std::isfinite(v)) return "expected a finite number, got '" + value + "'";
        return {};
      },
      "");
}

// Gives every floating-point option of `app` and of its subcommands the finite_number() check. Call
// it after the options are declared and before parsing.
inline void refuse_non_finite(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    if (option->get_type_name().find("FLOAT") != std::string::npos) option->check(finite_number());
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_non_finite(*sub);
}

}  // namespace chorus::cli
