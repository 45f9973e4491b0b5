#include "optim/shard_state.h"

#include <ATen/ATen.h>

#include <sstream>

#include "common/errors.h"
#include "sharding/communicator.h"

namespace llm {

void sum_over_ranks(at::Tensor& full, Communicator* across) {
  if (across != nullptr && across->world_size() > 1) across->all_reduce(full, ReduceOp::sum);
}

at::Tensor assemble_rows(const at::Tensor& local, int64_t rows, int64_t first_row, int64_t rows_held,
                         Communicator* across) {
  std::vector<int64_t> shape = local.sizes().vec();
  shape[0] = rows;
  at::Tensor full = at::zeros(shape, local.options().memory_format(at::MemoryFormat::Contiguous));
  if (rows_held > 0) full.narrow(0, first_row, rows_held).copy_(local.narrow(0, 0, rows_held));
  sum_over_ranks(full, across);
  return full;
}

at::Tensor take_rows(const at::Tensor& full, int64_t rows_per_rank, int64_t first_row, int64_t rows_held) {
  std::vector<int64_t> shape = full.sizes().vec();
  shape[0] = rows_per_rank;
  at::Tensor local = at::zeros(shape, full.options().memory_format(at::MemoryFormat::Contiguous));
  if (rows_held > 0) local.narrow(0, 0, rows_held).copy_(full.narrow(0, first_row, rows_held));
  return local;
}

int64_t check_full_state(const std::map<std::string, at::Tensor>& state,
                         const std::map<std::string, FullStateShape>& expected, const std::string& optimizer) {
  std::vector<std::string> problems;
  auto shape_text = [](at::IntArrayRef shape) {
    std::ostringstream text;
    text << shape;
    return text.str();
  };
  int64_t step = 0;
  const auto step_entry = state.find("step");
  if (step_entry == state.end()) {
    problems.push_back("key 'step' is missing");
  } else if (!step_entry->second.defined() || step_entry->second.numel() != 1 ||
             !at::isIntegralType(step_entry->second.scalar_type(), /*includeBool=*/false) ||
             step_entry->second.item<int64_t>() < 0) {
    problems.push_back("key 'step' must hold one integer >= 0");
  } else {
    step = step_entry->second.item<int64_t>();
  }
  for (const auto& [key, full] : expected) {
    const auto entry = state.find(key);
    if (entry == state.end()) {
      problems.push_back("key '" + key + "' is missing");
    } else if (!entry->second.defined() || entry->second.sizes() != at::IntArrayRef(full.shape)) {
      problems.push_back("key '" + key + "' has shape " +
                         (entry->second.defined() ? shape_text(entry->second.sizes()) : "undefined") + " but " +
                         full.what + " has shape " + shape_text(full.shape));
    } else if (entry->second.scalar_type() != at::kFloat) {
      problems.push_back("key '" + key + "' must be float32");
    }
  }
  for (const auto& [key, value] : state)
    if (key != "step" && !expected.count(key))
      problems.push_back("key '" + key + "' is unexpected");
  if (problems.empty()) return step;
  std::string message = "cannot load the " + optimizer + " state: ";
  for (size_t i = 0; i < problems.size() && i < 12; ++i) message += (i ? "; " : "") + problems[i];
  if (problems.size() > 12) message += "; and " + std::to_string(problems.size() - 12) + " more";
  throw UserError(message + ". Was the checkpoint written by the same --optimizer and its flags "
                            "(--rank, --proj_type, --subset_size, --adam_beta1) for the same model?");
}

}  // namespace llm
