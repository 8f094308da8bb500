// Helpers shared by the autograd tests: seeded float64 inputs in the domains the ops need (any,
// positive, away from zero), a matcher for chorus::Error messages, and a value check that prints
// both tensors when they differ. Tests get their randomness only from a Generator they seed.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace chorus::testing {

enum class Values { Any, Positive, AwayFromZero };

// A float64 tensor of `shape` drawn from `gen`: Any ~ N(0, 1); Positive in [0.5, 2); AwayFromZero
// has |x| in [0.2, 1.5) with a random sign (for ops with a kink at 0: abs, relu, p-norms).
inline Tensor random_values(const Shape& shape, Values values, Generator& gen) {
  NoGradGuard no_grad;
  const TensorOptions f64{.dtype = kFloat64};
  switch (values) {
    case Values::Any:
      return randn(shape, f64, &gen);
    case Values::Positive:
      return add(mul(rand(shape, f64, &gen), 1.5), 0.5);
    case Values::AwayFromZero: {
      Tensor magnitude = add(mul(rand(shape, f64, &gen), 1.3), 0.2);
      Tensor sign = where(lt(rand(shape, f64, &gen), 0.5), full(shape, -1.0, f64), full(shape, 1.0, f64));
      return mul(magnitude, sign);
    }
  }
  return Tensor();
}

// A float64 leaf that requires grad.
inline Tensor leaf(const Shape& shape, Generator& gen, Values values = Values::Any) {
  Tensor t = random_values(shape, values, gen);
  t.requires_grad_();
  return t;
}

inline Tensor leaf_from(const std::vector<double>& values, const Shape& shape) {
  Tensor t = tensor(values, shape);
  t.requires_grad_();
  return t;
}

// Matches a chorus::Error (not just any exception) whose message contains every one of `parts`.
inline Catch::Matchers::Generic::PredicateMatcher<chorus::Error> error_containing(std::vector<std::string> parts) {
  std::string description = "chorus::Error containing";
  for (const auto& part : parts) description += " \"" + part + "\"";
  return Catch::Matchers::Predicate<chorus::Error>(
      [parts](const chorus::Error& error) {
        const std::string message = error.what();
        for (const auto& part : parts) {
          if (message.find(part) == std::string::npos) return false;
        }
        return true;
      },
      description);
}

// True when `actual` has `expected`'s shape and values (float64 tolerance by default); on a
// mismatch the assertion that uses it prints both tensors.
inline bool same_values(const Tensor& actual, const Tensor& expected, double rtol = 1e-9, double atol = 1e-12) {
  if (!actual.defined() || !expected.defined()) {
    UNSCOPED_INFO("actual defined: " << actual.defined() << ", expected defined: " << expected.defined());
    return false;
  }
  UNSCOPED_INFO("actual:\n" << actual.str() << "\nexpected:\n" << expected.str());
  if (actual.sizes() != expected.sizes()) return false;
  NoGradGuard no_grad;
  return allclose(actual.to(kFloat64), expected.to(kFloat64), rtol, atol);
}

}  // namespace chorus::testing
