// What the trainer reads from folders that may come from someone else (issue 44, common/input_paths.h):
// a name read from a file is a plain name inside its folder, and a file read is a regular file, or
// it is said what it is (a fifo, a device, a link to nothing, a loop of links), never "missing" and
// never skipped: in --data's folders, globs and files, and in the run folders `trainer report` reads.
// The checkpoint's and the transformers folder's cases are in checkpoint_resume_test.cpp
// (HandEditedManifest) and export_refusals_test.cpp (Cases/Refused).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/input_paths.h"
#include "data/token_corpus.h"
#include "tests/data_test_util.h"
#include "tests/test_util.h"

namespace llm::input_paths_test {
namespace {

namespace fs = std::filesystem;
using testing::expect_user_error;
using testing::run_command;
using testing::ScratchDir;

void make_fifo(const fs::path& path) { ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path; }

TEST(InputPaths, APlainNameIsOneInsideItsFolder) {
  EXPECT_EQ(plain_name_problem("rank0.safetensors"), "");
  EXPECT_EQ(plain_name_problem("model-00001-of-00002.safetensors"), "");
  EXPECT_EQ(plain_name_problem(""), "is empty");
  EXPECT_EQ(plain_name_problem(".."), "is \"..\"");
  EXPECT_EQ(plain_name_problem("."), "is \".\"");
  EXPECT_EQ(plain_name_problem("../../etc/passwd"), "holds a '/'");
  EXPECT_EQ(plain_name_problem("sub/rank0.json"), "holds a '/'");
  EXPECT_EQ(plain_name_problem("/etc/passwd"), "is an absolute path");
}

TEST(InputPaths, EachKindOfNonRegularFileIsSaidAsWhatItIs) {
  ScratchDir dir("input_kinds");
  std::ofstream(dir / "file") << "x";
  fs::create_symlink(dir / "file", dir / "link_to_file");
  make_fifo(dir / "fifo");
  fs::create_symlink("/dev/zero", dir / "zero");
  fs::create_symlink(dir / "gone", dir / "dangling");
  fs::create_symlink(dir / "loop", dir / "loop");
  fs::create_directories(dir / "folder");
  EXPECT_EQ(regular_file_problem(dir / "file"), "");
  EXPECT_EQ(regular_file_problem(dir / "link_to_file"), "");
  EXPECT_EQ(regular_file_problem(dir / "absent"), "is missing");
  EXPECT_EQ(regular_file_problem(dir / "fifo"), "is a fifo, not a regular file");
  EXPECT_EQ(regular_file_problem(dir / "zero"), "is a symbolic link to /dev/zero, a character device, not a regular file");
  EXPECT_EQ(regular_file_problem(dir / "dangling"),
            "is a symbolic link to nothing (" + (dir / "gone").string() + "), not a regular file");
  EXPECT_EQ(regular_file_problem(dir / "loop"), "is a loop of symbolic links, not a regular file");
  EXPECT_EQ(regular_file_problem(dir / "folder"), "is a folder, not a regular file");
}

// --data: a token file's name in a folder, a glob's match or a named item that is not a regular
// file is exit 2 saying what it is (before: skipped, so the run trained on the other shards, or for
// a named fifo, start-up blocked forever).
TEST(InputPaths, DataThatIsNotARegularFileIsRefusedSayingWhatItIs) {
  ScratchDir dir("input_data");
  const fs::path folder = dir / "corpus";
  fs::create_directories(folder / "nested.bin");  // a folder with a shard's extension: not a shard, skipped
  std::ofstream(folder / "a.tok") << "";
  make_fifo(folder / "b.bin");
  expect_user_error([&] { expand_data_spec(folder.string()); },
                    {"--data", (folder / "b.bin").string() + " is a fifo, not a regular file",
                     "a token file's name in the folder " + folder.string()});
  fs::remove(folder / "b.bin");
  fs::create_symlink("/dev/zero", folder / "c.npy");
  expect_user_error([&] { expand_data_spec(folder.string()); },
                    {(folder / "c.npy").string() + " is a symbolic link to /dev/zero, a character device"});
  expect_user_error([&] { expand_data_spec((folder / "*.npy").string()); },
                    {(folder / "c.npy").string() + " is a symbolic link to /dev/zero", "a match of "});
  fs::remove(folder / "c.npy");
  fs::create_symlink(dir / "gone.tok", folder / "d.tok");
  expect_user_error([&] { expand_data_spec((folder / "d.tok").string(), "--eval_data"); },
                    {"--eval_data", (folder / "d.tok").string() + " is a symbolic link to nothing"});
  fs::remove(folder / "d.tok");
  make_fifo(dir / "named.bin");
  expect_user_error([&] { expand_data_spec((dir / "named.bin").string()); },
                    {(dir / "named.bin").string() + " is a fifo, not a regular file (a token file)"});
  fs::create_symlink(folder / "e.tok", folder / "e.tok");
  expect_user_error([&] { expand_data_spec(folder.string()); },
                    {(folder / "e.tok").string() + " is a loop of symbolic links"});
}

// A Megatron dataset whose .idx is a fifo: exit 2 saying so (before: the open blocked for a writer,
// and the job hung at start-up, deaf to SIGTERM during start-up: `timeout -k` ends it here, exit 137).
TEST(InputPaths, AMegatronIndexThatIsAFifoIsRefusedNotWaitedOn) {
  ScratchDir dir("input_megatron_fifo");
  std::ofstream(dir / "corpus.bin", std::ios::binary) << std::string(256, '\1');
  make_fifo(dir / "corpus.idx");
  const auto result = run_command("timeout -k 5 60 " + testing::trainer_binary().string() + " --config " +
                                  (testing::source_dir() / "configs/llama_micro.json").string() +
                                  " --device cpu --max_length 16 --num_training_steps 1 --data " +
                                  (dir / "corpus.bin").string() + " --run_dir " + (dir / "run").string());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find((dir / "corpus.idx").string() + ": index: is a fifo, not a regular file (the index of "),
            std::string::npos)
      << result.output;
}

// `trainer report`: a run folder's metrics.jsonl or ledger that is a fifo or a device is exit 2
// saying so (before: "missing", as if the folder were not a run's).
TEST(InputPaths, ReportSaysWhatARunFilesIs) {
  ScratchDir dir("input_report");
  const fs::path fixture = testing::source_dir() / "tests/fixtures/memory_runs/adamw_fp32_w1";
  const std::string report = testing::trainer_binary().string() + " report ";
  fs::create_directories(dir / "fifo_run");
  make_fifo(dir / "fifo_run/metrics.jsonl");
  auto fifo = run_command(report + (dir / "fifo_run").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(fifo.exit_code, 2) << fifo.output;
  EXPECT_NE(fifo.output.find("metrics.jsonl: " + (dir / "fifo_run/metrics.jsonl").string() + " is a fifo"),
            std::string::npos)
      << fifo.output;
  fs::create_directories(dir / "device_run");
  fs::copy_file(fixture / "metrics.jsonl", dir / "device_run/metrics.jsonl");
  fs::create_symlink("/dev/zero", dir / "device_run/memory.rank0.jsonl");
  auto device = run_command(report + (dir / "device_run").string() + " --out " + (dir / "out2").string());
  EXPECT_EQ(device.exit_code, 2) << device.output;
  EXPECT_NE(device.output.find("memory.rank0.jsonl: " + (dir / "device_run/memory.rank0.jsonl").string() +
                               " is a symbolic link to /dev/zero, a character device"),
            std::string::npos)
      << device.output;
}

}  // namespace
}  // namespace llm::input_paths_test
