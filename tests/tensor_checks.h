// Tensor assertions and golden-file loading shared by the optimizer and model tests.
#pragma once

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

namespace llm::testing {

// Fails on the worst element where |actual - expected| > absolute + relative * |expected|.
void expect_all_close(const at::Tensor& actual, const at::Tensor& expected, double absolute,
                      double relative, const std::string& what);

// Bit for bit: the same shape, dtype and bytes (at::equal would call -0 and 0 equal and NaN
// unequal); a failure names the first differing element and how many differ.
void expect_same_bits(const at::Tensor& actual, const at::Tensor& expected, const std::string& what);

// A golden file written by a tests/golden/make_*.py script: a flat dict of tensors.
std::map<std::string, at::Tensor> load_golden(const std::string& file_name);

}  // namespace llm::testing
