#include "tests/tensor_checks.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include "tests/test_util.h"

namespace llm::testing {

void expect_all_close(const at::Tensor& actual, const at::Tensor& expected, double absolute,
                      double relative, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const at::Tensor a = actual.detach().to(at::kCPU, at::kDouble).flatten();
  const at::Tensor e = expected.detach().to(at::kCPU, at::kDouble).flatten();
  const at::Tensor excess = (a - e).abs() - (absolute + relative * e.abs());
  const int64_t worst = excess.argmax().item<int64_t>();
  EXPECT_LE(excess[worst].item<double>(), 0.0)
      << what << ": element " << worst << " of " << a.numel() << " is "
      << a[worst].item<double>() << ", expected " << e[worst].item<double>() << " (|diff| "
      << std::abs(a[worst].item<double>() - e[worst].item<double>()) << ", tolerance "
      << absolute << " + " << relative << " * |expected|)";
}

void expect_same_bits(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  const at::Tensor a = actual.detach().cpu().contiguous(), e = expected.detach().cpu().contiguous();
  const size_t bytes = static_cast<size_t>(a.numel()) * a.element_size();
  if (std::memcmp(a.const_data_ptr(), e.const_data_ptr(), bytes) == 0) return;
  // The bit patterns as integers of the element's width, so -0 against 0 counts too.
  const at::ScalarType bits = a.element_size() == 2 ? at::kShort : a.element_size() == 4 ? at::kInt : at::kLong;
  const at::Tensor differ = a.view(bits).flatten() != e.view(bits).flatten();
  const int64_t first = differ.nonzero()[0][0].item<int64_t>();
  ADD_FAILURE() << what << ": differs first at element " << first << " of " << a.numel() << " ("
                << a.flatten()[first].item<double>() << " vs " << e.flatten()[first].item<double>() << "), "
                << differ.sum().item<int64_t>() << " elements differ";
}

std::map<std::string, at::Tensor> load_golden(const std::string& file_name) {
  const auto path = source_dir() / "tests" / "golden" / file_name;
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file) << "cannot open " << path << "; run its maker in tests/golden/";
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::map<std::string, at::Tensor> golden;
  for (const auto& entry : torch::pickle_load(bytes).toGenericDict())
    golden[entry.key().toStringRef()] = entry.value().toTensor();
  return golden;
}

}  // namespace llm::testing
