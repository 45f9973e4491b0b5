#include "tests/tensor_checks.h"

#include <gtest/gtest.h>

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
