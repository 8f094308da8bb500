// Helpers shared by the nn tests: read a tensor's values into doubles for a plain-loop reference,
// compare against such a reference, and capture the message a call throws.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace chorus::nn_test {

inline std::vector<double> doubles(const Tensor& t) {
  Tensor c = t.detach().to(kFloat64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// |got - expected| <= tol * (1 + |expected|), element by element, naming the first elements that differ.
inline void check_close(const Tensor& actual, const std::vector<double>& expected, double tol) {
  std::vector<double> got = doubles(actual);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", expected " << expected[i]);
    CHECK(std::abs(got[i] - expected[i]) <= tol * (1.0 + std::abs(expected[i])));
  }
}

// The what() of the chorus::Error `fn` throws, or "no error".
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace chorus::nn_test
