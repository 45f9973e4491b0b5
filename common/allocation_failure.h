// A failed allocation, as the trainer reports it: a plain error (exit 2, like any input the machine
// cannot hold) naming what was being allocated and how many bytes, with what to change, instead of
// LibTorch's message and backtrace.
//
// Where the big allocations happen (the model's units) the code runs inside allocating("unit embed
// of the model", ...), which turns std::bad_alloc and LibTorch's allocation errors (c10::OutOfMemoryError,
// and the c10::Error DefaultCPUAllocator throws) into AllocationFailed naming that; anywhere else
// run_reporting_failures (sharding/world.h) recognises them with the same words, without the name.
// Header-only: it is included by the model and by the failure reporter alone.
#pragma once

#include <cstdint>
#include <cstdio>
#include <new>
#include <optional>
#include <string>

#include <c10/util/Exception.h>

#include "common/errors.h"

namespace llm {

// LibTorch's message says the allocation failed: the CPU allocator's "can't allocate memory", the
// CUDA caching allocator's "out of memory".
inline bool is_allocation_failure(const std::string& message) {
  return message.find("can't allocate memory") != std::string::npos ||
         message.find("out of memory") != std::string::npos || message.find("Cannot allocate memory") != std::string::npos;
}

// The bytes LibTorch's CPU allocator says it was asked for ("you tried to allocate N bytes").
inline std::optional<int64_t> allocation_bytes_in(const std::string& message) {
  const std::string marker = "tried to allocate ";
  const size_t at = message.find(marker);
  if (at == std::string::npos) return std::nullopt;
  long long bytes = 0;
  char unit[8] = {};
  if (std::sscanf(message.c_str() + at + marker.size(), "%lld %5s", &bytes, unit) != 2 || std::string(unit) != "bytes")
    return std::nullopt;
  return static_cast<int64_t>(bytes);
}

// "out of memory: allocating unit embed of the model (256.00 GiB) failed: REASON. lower ...".
// `what` may be empty (not known), `reason` is the allocator's message, its backtrace left out.
inline std::string allocation_failure_message(const std::string& what, const std::string& reason) {
  std::string size;
  if (const std::optional<int64_t> bytes = allocation_bytes_in(reason)) {
    char text[96];
    std::snprintf(text, sizeof(text), "%.2f GiB, %lld bytes", static_cast<double>(*bytes) / 1073741824.0,
                  static_cast<long long>(*bytes));
    size = text;
  }
  std::string message = "out of memory: allocating ";
  message += what.empty() ? std::string("memory") : what;
  if (!size.empty()) message += " (" + size + ")";
  message += " failed on rank " + std::to_string(process_identity().rank) + " (" + process_identity().device +
             "): " + reason;
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ' || message.back() == '.')) message.pop_back();
  message += ". This rank cannot hold the run: lower the model size, use more ranks or --offload optimizer, or check "
             "the config (--config: vocab_size, hidden_size, num_hidden_layers); `trainer estimate` with the same flags "
             "shows what each rank needs";
  return message;
}

class AllocationFailed : public UserError {
 public:
  AllocationFailed(const std::string& what, const std::string& reason)
      : UserError(allocation_failure_message(what, reason)) {}
};

// Runs `body`; an allocation failure inside it becomes AllocationFailed naming `what`.
template <class Body>
decltype(auto) allocating(const std::string& what, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc& error) {
    throw AllocationFailed(what, std::string("std::bad_alloc (") + error.what() + ")");
  } catch (const c10::Error& error) {
    if (!is_allocation_failure(error.what_without_backtrace())) throw;
    throw AllocationFailed(what, error.what_without_backtrace());
  }
}

}  // namespace llm
