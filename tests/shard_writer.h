// The data tests' reference writer: tests/data/write_shards.py, run with the project's Python, writes
// token shards in the formats other trainers publish (numpy.save, llm.c's write_datafile,
// Megatron-LM's _IndexWriter, and ours), so data_formats_test.cpp and data_format_errors_test.cpp
// compare our reader with the published layouts rather than with our own writer. A test skips where
// the Python environment or its numpy is missing (SKIP_WITHOUT_SHARD_WRITER).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace llm::testing {

// Why the writer cannot run here, or "" when it can.
inline std::string shard_writer_unavailable() {
#ifdef TRAINER_PYTHON
  const std::filesystem::path interpreter = python();
  if (interpreter.empty() || !std::filesystem::exists(interpreter))
    return "no Python environment at '" + interpreter.string() + "'";
  static const bool has_numpy = run_command(interpreter.string() + " -c 'import numpy'").exit_code == 0;
  return has_numpy ? "" : "numpy is not importable from " + interpreter.string();
#else
  return "this build names no TRAINER_PYTHON";
#endif
}

#define SKIP_WITHOUT_SHARD_WRITER()                                                        \
  do {                                                                                     \
    const std::string shard_writer_missing_ = ::llm::testing::shard_writer_unavailable();  \
    if (!shard_writer_missing_.empty()) GTEST_SKIP() << shard_writer_missing_;             \
  } while (0)

// Runs write_shards.py with `arguments` (FORMAT PATH ...); throws with its output if it fails.
inline CommandResult run_shard_writer(const std::string& arguments) {
#ifdef TRAINER_PYTHON
  const CommandResult result = run_command(python().string() + " " +
                                           (source_dir() / "tests/data/write_shards.py").string() + " " + arguments);
  if (result.exit_code != 0)
    throw std::runtime_error("write_shards.py " + arguments + " failed (" + std::to_string(result.exit_code) +
                             "): " + result.output);
  return result;
#else
  throw std::runtime_error("write_shards.py needs TRAINER_PYTHON: " + arguments);
#endif
}

// Writes `tokens` as one shard of `format` (npy, llmc, megatron, trainer) at `path` (megatron: PATH
// is the .bin; its .idx goes beside it; folders made as needed), with further write_shards.py flags (--dtype, --vocab, --docs,
// --damage ...). The ids travel through a file in a folder of their own, so a folder of shards holds
// nothing else.
inline void write_shard(const std::string& format, const std::filesystem::path& path,
                        const std::vector<int64_t>& tokens, const std::string& flags = "") {
  static const ScratchDir ids_dir("shard_ids");
  std::filesystem::create_directories(path.parent_path());
  static int written = 0;
  const std::filesystem::path ids = ids_dir / ("ids_" + std::to_string(written++) + ".txt");
  {
    std::ofstream out(ids);
    for (int64_t id : tokens) out << id << '\n';
  }
  run_shard_writer(format + " " + path.string() + " --tokens-file " + ids.string() + " " + flags);
  std::filesystem::remove(ids);
}

// `count` ids below `vocab`: uniform, with the top of the vocabulary where a narrowing or sign bug
// shows (vocab - 1 first, vocab - 2 last, a run from the top tenth in the middle) and 0 once.
inline std::vector<int64_t> known_tokens(int64_t count, int64_t vocab, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<int64_t> tokens(static_cast<size_t>(count));
  for (int64_t& id : tokens) id = static_cast<int64_t>(random() % static_cast<uint64_t>(vocab));
  const int64_t tenth = std::max<int64_t>(1, vocab / 10);
  for (int64_t i = count / 2; i < std::min(count, count / 2 + 64); ++i)
    tokens[static_cast<size_t>(i)] = vocab - 1 - static_cast<int64_t>(random() % static_cast<uint64_t>(tenth));
  if (count > 0) tokens.front() = vocab - 1;
  if (count > 1) tokens.back() = vocab > 1 ? vocab - 2 : 0;
  if (count > 2) tokens[1] = 0;
  return tokens;
}

}  // namespace llm::testing
