// What the trainer reads and resumes, tried as a hostile user would (issue 51), through the binary on
// CPU:
//   - JSON nested 100,000 deep in every file the trainer reads (a config, a mixture, a manifest, a
//     rank index, a safetensors header, an --init_from config.json) is refused naming the file
//     (before: SIGSEGV, no message), and a message prints a bounded excerpt of a huge value;
//   - a rank index whose crc32c is not hex is refused naming the file and tensor (before: "stoul");
//   - the delayed offload update resumes past its warm-up (before: the warm-up began again);
//   - the estimate's cost does not grow with the micro-batches or the evaluation (before: hours, or
//     21 GB and the kernel's OOM killer);
//   - a resume with a longer --num_training_steps and the default --warmup_steps, or fp32 without
//     --precision pure, goes on; a manifest whose "run" is not an object is refused;
//   - --eval_data's shards beside --data's past the open-file limit are refused naming --eval_data and
//     the limit; a same-size change to a shard past its first 4 KiB is seen on resume;
//   - SIGHUP is a preemption: the run saves and exits 0 (before: exit 129, nothing saved).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/crc32c.h"
#include "data/token_file.h"
#include "tests/checkpoint_test_util.h"
#include "tests/test_util.h"

namespace llm::hostile_inputs_test {
namespace {

namespace fs = std::filesystem;
using testing::mentions;
using testing::run_command;
using testing::ScratchDir;
using testing::trainer_command;

std::string trainer() { return "OMP_NUM_THREADS=1 " + testing::trainer_binary().string(); }
std::string micro() { return (testing::source_dir() / "configs/llama_micro.json").string(); }

// A value nested `depth` arrays deep: 2 * depth bytes.
std::string nested(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']'); }
constexpr int kDeep = 100000;
const std::string kTooDeep = "its JSON nests arrays or objects more than 64 deep";

void expect_deep_refused(const testing::CommandResult& result, const fs::path& file) {
  EXPECT_EQ(result.exit_code, 2) << result.output.substr(0, 2000);
  EXPECT_TRUE(mentions(result.output, file.string() + ": its JSON nests arrays or objects more than 64 deep"))
      << result.output.substr(0, 2000);
}

// Replaces `key` of a JSON file with a value nested kDeep deep (text surgery: the value cannot be
// built as JSON here either).
void nest_value(const fs::path& file, const std::string& key) {
  std::string text = testing::read_file(file);
  const std::string quoted = "\"" + key + "\"";
  const size_t at = text.find(quoted);
  ASSERT_NE(at, std::string::npos) << key << " in " << file;
  const size_t colon = text.find(':', at + quoted.size());
  text.insert(colon + 1, nested(kDeep) + ", \"was_" + key + "\":");
  std::ofstream(file, std::ios::trunc) << text;
}

// Rewrites manifest.json's record of `name` (size and CRC-32C) after the file was edited, as a
// hostile editor would, so the reader gets as far as parsing it.
void relist(const fs::path& checkpoint, const std::string& name) {
  nlohmann::json manifest = testing::manifest(checkpoint);
  const std::string bytes = testing::read_file(checkpoint / name);
  manifest["files"][name] = {{"bytes", bytes.size()}, {"crc32c", crc_text(crc32c(bytes.data(), bytes.size()))}};
  std::ofstream(checkpoint / "manifest.json", std::ios::trunc) << manifest.dump(1);
}

TEST(DeepJson, EveryReaderRefusesItNamingTheFile) {
  ScratchDir dir("deep_json");
  // --config, nested arrays and nested objects
  std::ofstream(dir / "config.json") << "{\"hidden_size\": " << nested(kDeep) << "}";
  expect_deep_refused(run_command(trainer() + " --config " + (dir / "config.json").string() + " --device cpu"),
                      dir / "config.json");
  {
    std::ofstream objects(dir / "objects.json");
    for (int i = 0; i < kDeep; ++i) objects << "{\"a\": ";
    objects << "1" << std::string(kDeep, '}');
  }
  expect_deep_refused(run_command(trainer() + " --config " + (dir / "objects.json").string() + " --device cpu"),
                      dir / "objects.json");
  // a --data mixture file
  std::ofstream(dir / "mix.json") << "{\"sources\": " << nested(kDeep) << "}";
  expect_deep_refused(run_command(trainer_command("--num_training_steps 1 --data " + (dir / "mix.json").string() +
                                                  " --run_dir " + (dir / "r0").string())),
                      dir / "mix.json");
  // a checkpoint's manifest (world_size, run.lr) and a rank index's shape
  testing::train_four_steps(dir / "ckpt", dir / "run");
  const auto resume = [&](const fs::path& step, const std::string& run) {
    return run_command(trainer_command("--num_training_steps 4 --continue_from " + step.string() + " --run_dir " +
                                       (dir / run).string()));
  };
  for (const std::string key : {"world_size", "lr"}) {
    fs::create_directories(dir / ("edited_" + key));
    fs::copy(dir / "ckpt/step_2", dir / ("edited_" + key + "/step_2"), fs::copy_options::recursive);
    nest_value(dir / ("edited_" + key + "/step_2/manifest.json"), key);
    expect_deep_refused(resume(dir / ("edited_" + key + "/step_2"), "r_" + key),
                        dir / ("edited_" + key + "/step_2/manifest.json"));
  }
  fs::create_directories(dir / "edited_index");
  fs::copy(dir / "ckpt/step_2", dir / "edited_index/step_2", fs::copy_options::recursive);
  nest_value(dir / "edited_index/step_2/rank0.json", "shape");
  relist(dir / "edited_index/step_2", "rank0.json");
  expect_deep_refused(resume(dir / "edited_index/step_2", "r_index"), dir / "edited_index/step_2/rank0.json");
  // --init_from: its config.json, and a safetensors header
  const fs::path hf = dir / "hf";
  ASSERT_EQ(run_command(trainer() + " export --from " + (dir / "ckpt").string() + " --to " + hf.string()).exit_code, 0);
  fs::copy(hf, dir / "hf_config", fs::copy_options::recursive);
  nest_value(dir / "hf_config/config.json", "hidden_size");
  expect_deep_refused(run_command(trainer_command("--num_training_steps 1 --init_from " + (dir / "hf_config").string() +
                                                  " --run_dir " + (dir / "r_hf").string())),
                      dir / "hf_config/config.json");
  fs::copy(hf, dir / "hf_header", fs::copy_options::recursive);
  const std::string header = "{\"__metadata__\": " + nested(kDeep) + "}";
  std::string file(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(file.data(), &length, 8);
  std::ofstream(dir / "hf_header/model.safetensors", std::ios::binary | std::ios::trunc) << file << header;
  const auto header_run = run_command(trainer_command("--num_training_steps 1 --init_from " +
                                                      (dir / "hf_header").string() + " --run_dir " +
                                                      (dir / "r_header").string()));
  expect_deep_refused(header_run, dir / "hf_header/model.safetensors (its header)");
}

// A value of 100,000 numbers where a number goes: the message shows its first characters and its
// length, not 600 KB of it.
TEST(DeepJson, AMessageShowsABoundedExcerptOfAHugeValue) {
  ScratchDir dir("huge_value");
  std::ofstream config(dir / "config.json");
  config << "{\"hidden_size\": [";
  for (int i = 0; i < 100000; ++i) config << (i ? "," : "") << i;
  config << "]}";
  config.close();
  const auto refused = run_command(trainer() + " --config " + (dir / "config.json").string() + " --device cpu");
  EXPECT_EQ(refused.exit_code, 2) << refused.output.substr(0, 2000);
  EXPECT_TRUE(mentions(refused.output, "hidden_size: expected a positive integer")) << refused.output.substr(0, 2000);
  EXPECT_TRUE(mentions(refused.output, "... (588891 characters)")) << refused.output.substr(0, 2000);
  EXPECT_LT(refused.output.size(), 2000u);
}

TEST(DamagedIndex, ACrc32cThatIsNotHexIsNamedWithItsFileAndTensor) {
  ScratchDir dir("crc_not_hex");
  testing::train_four_steps(dir / "ckpt", dir / "run");
  for (const std::string crc : {"zzzzzzzz", "0123456789abcdef0"}) {
    const fs::path step = dir / ("edited_" + crc) / "step_2";
    fs::create_directories(step.parent_path());
    fs::copy(dir / "ckpt/step_2", step, fs::copy_options::recursive);
    nlohmann::json index = nlohmann::json::parse(testing::read_file(step / "rank0.json"));
    const std::string tensor = index.at("tensors").begin().key();
    index["tensors"][tensor]["crc32c"] = crc;
    std::ofstream(step / "rank0.json", std::ios::trunc) << index.dump();
    relist(step, "rank0.json");
    const auto refused = run_command(trainer_command("--num_training_steps 4 --continue_from " + step.string() +
                                                     " --run_dir " + (dir / ("r" + crc)).string()));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_TRUE(mentions(refused.output, (step / "rank0.json").string() + ": " + tensor + ": crc32c \"" + crc +
                                             "\" is not a CRC-32C (8 hex digits)"))
        << refused.output;
  }
}

// --offload_delayed_update 2, resumed at step 4: the steps after equal the uninterrupted run's (which
// saved at 4 too), bit for bit, and its trace numbers the steps on from 5 (before: the warm-up began
// again, so step 6 on differed, and the trace counted from 1).
TEST(DelayedUpdateResume, GoesOnPastTheWarmUpAsTheUninterruptedRun) {
  ScratchDir dir("delayed_resume");
  const std::string flags = "--offload optimizer --offload_delayed_update 2 --lr 0.01 --num_training_steps 8 ";
  const auto whole = run_command(trainer_command(flags + "--save_every 4 --save_dir " + (dir / "ckpt").string() +
                                                 " --run_dir " + (dir / "whole").string()));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const auto resumed = run_command(trainer_command(flags + "--offload_trace --continue_from " +
                                                   (dir / "ckpt/step_4").string() + " --run_dir " +
                                                   (dir / "resumed").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto want = testing::read_metrics_events(dir / "whole", "train");
  const auto got = testing::read_metrics_events(dir / "resumed", "train");
  ASSERT_EQ(want.size(), 8u);
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(got[i].at("step"), want[4 + i].at("step"));
    EXPECT_EQ(got[i].at("loss").get<double>(), want[4 + i].at("loss").get<double>()) << "step " << 5 + i;
  }
  std::ifstream trace(dir / "resumed/offload_trace.rank0.jsonl");
  int64_t first_gradient_step = 0;
  for (std::string line; std::getline(trace, line) && first_gradient_step == 0;) {
    const nlohmann::json event = nlohmann::json::parse(line);
    if (event.at("what") == "gradient") first_gradient_step = event.at("step").get<int64_t>();
  }
  EXPECT_EQ(first_gradient_step, 5) << "the trace numbers the resumed run's steps as the uninterrupted run's";
}

std::string estimate(const std::string& flags) {
  return "OMP_NUM_THREADS=1 timeout 120 " + testing::trainer_binary().string() + " estimate --config " + micro() + " --device cpu --max_length 16 " + flags;
}

// The estimate's rank figures without the phases, which list a step's micro-batches.
nlohmann::json figures(const std::string& output) {
  nlohmann::json estimate = nlohmann::json::parse(output.substr(output.find('{')));
  for (nlohmann::json& rank : estimate["ranks"]) rank.erase("phases");
  return estimate;
}

// 2^23 micro-batches a step, 10^8 held-out sequences, a micro-batch of 2^40 for --fit: the estimate
// simulates one micro-batch of each kind and one evaluation batch after the first, so each answers
// (under `timeout 120`, not a timed assertion), with the figures of three micro-batches.
TEST(EstimateCost, DoesNotGrowWithTheMicroBatchesOrTheEvaluation) {
  const auto three = run_command(estimate("--world_size 2 --batch_size 4 --total_batch_size 24 --json"));
  ASSERT_EQ(three.exit_code, 0) << three.output;
  const auto many = run_command(estimate("--world_size 2 --batch_size 4 --total_batch_size 67108864 --json"));
  ASSERT_EQ(many.exit_code, 0) << many.output.substr(0, 2000);
  EXPECT_EQ(figures(many.output), figures(three.output));
  const auto evaluated = run_command(estimate("--batch_size 2 --eval_sequences 100000000 --json"));
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output.substr(0, 2000);
  const auto fit = run_command(estimate("--batch_size 1099511627776 --fit --memory_budget_gib 1"));
  EXPECT_NE(fit.exit_code, 124) << "timed out";
  EXPECT_TRUE(mentions(fit.output, "| # | add |") || mentions(fit.output, "nothing fits")) << fit.output.substr(0, 2000);
  ScratchDir dir("eval_sequences");
  const auto run = run_command(trainer_command("--num_training_steps 1 --eval_sequences 100000000 --run_dir " +
                                               dir.path().string()));
  EXPECT_EQ(run.exit_code, 0) << run.output.substr(0, 2000);
}

// GaLore at 65536 ranks: the ranks that own no matrix's SVD are one kind, simulated once and printed
// once (before: 65536 simulations per estimate, 12 minutes for --fit, 2 GB of JSON).
TEST(EstimateCost, GaLoreAtManyRanksPrintsEachKindOnce) {
  const auto estimated = run_command("OMP_NUM_THREADS=1 timeout 120 " + testing::trainer_binary().string() +
                                     " estimate --config " +
                                     (testing::source_dir() / "configs/llama_7b.json").string() +
                                     " --device cuda --world_size 65536 --batch_size 1 --max_length 2048 "
                                     "--optimizer galore_adamw --json");
  ASSERT_EQ(estimated.exit_code, 0) << estimated.output.substr(0, 2000);
  EXPECT_LT(estimated.output.size(), 1000000u);
  const nlohmann::json json = nlohmann::json::parse(estimated.output.substr(estimated.output.find('{')));
  EXPECT_LT(json.at("simulated_ranks").get<int>(), 300) << "one kind per SVD owner, one for the rest";
  int covered = 0;
  for (const nlohmann::json& kind : json.at("ranks")) {
    EXPECT_EQ(kind.at("rank").get<int>(), covered) << "kinds cover the ranks in order";
    covered = kind.at("last_rank").get<int>() + 1;
  }
  EXPECT_EQ(covered, 65536);
}

// Train 4 steps without --warmup_steps (its default follows --num_training_steps) and save at 4.
fs::path four_steps_default_warmup(const ScratchDir& dir, const std::string& flags) {
  const std::string command = trainer() + " --config " + micro() + " --device cpu --batch_size 2 --max_length 16 "
                              "--eval_every 0 --num_training_steps 40 --stop_at_step 4 --save_dir " +
                              (dir / "ckpt").string() + " --run_dir " + (dir / "a").string() + " " + flags;
  const auto trained = run_command(command);
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  return dir / "ckpt/step_4";
}

TEST(ResumeSettings, ALongerScheduleWithTheDefaultWarmupGoesOn) {
  ScratchDir dir("longer_schedule");
  const fs::path step = four_steps_default_warmup(dir, "");
  const auto longer = run_command(trainer() + " --config " + micro() + " --device cpu --batch_size 2 --max_length 16 "
                                  "--eval_every 0 --num_training_steps 400 --stop_at_step 5 --continue_from " +
                                  step.string() + " --save_dir " + (dir / "ckpt").string() + " --run_dir " +
                                  (dir / "b").string());
  EXPECT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_TRUE(mentions(longer.output, "with the default --warmup_steps of that length (4 then, 20 now)")) << longer.output;
  // A --warmup_steps given that differs is still refused.
  const auto changed = run_command(trainer() + " --config " + micro() + " --device cpu --batch_size 2 --max_length 16 "
                                   "--eval_every 0 --num_training_steps 40 --warmup_steps 7 --continue_from " +
                                   step.string() + " --run_dir " + (dir / "c").string());
  EXPECT_EQ(changed.exit_code, 2) << changed.output;
  EXPECT_TRUE(mentions(changed.output, "--warmup_steps (the checkpoint's 4, this run's 7)")) << changed.output;
}

TEST(ResumeSettings, PrecisionMeansNothingInFloat32) {
  ScratchDir dir("fp32_precision");
  const fs::path step = four_steps_default_warmup(dir, "--precision pure");
  const auto resumed = run_command(trainer() + " --config " + micro() + " --device cpu --batch_size 2 --max_length 16 "
                                   "--eval_every 0 --num_training_steps 40 --stop_at_step 5 --continue_from " +
                                   step.string() + " --save_dir " + (dir / "ckpt").string() + " --run_dir " +
                                   (dir / "b").string());
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

TEST(ResumeSettings, AManifestWhoseRunIsNotAnObjectIsRefused) {
  ScratchDir dir("run_not_object");
  testing::train_four_steps(dir / "ckpt", dir / "a");
  nlohmann::json manifest = testing::manifest(dir / "ckpt/step_2");
  manifest["run"] = "lr=0.5";
  std::ofstream(dir / "ckpt/step_2/manifest.json", std::ios::trunc) << manifest.dump();
  const auto refused = run_command(trainer_command("--num_training_steps 4 --continue_from " +
                                                   (dir / "ckpt/step_2").string() + " --run_dir " + (dir / "b").string()));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(mentions(refused.output, "manifest.json: run: expected an object of the flags that wrote the checkpoint "
                                       "(got \"lr=0.5\")"))
      << refused.output;
}

// 100 shards in --data and 100 in --eval_data under a limit of 200 open files: each alone fits, both
// do not. Refused naming --eval_data, the files open already and the limit (before: "Too many open
// files; check --data" on one of --eval_data's shards).
TEST(OpenFiles, EvalDataBesideDataPastTheLimitIsRefusedNamingTheLimit) {
  ScratchDir dir("open_files");
  const std::vector<int64_t> tokens(400, 7);
  for (const char* folder : {"train", "eval"}) {
    fs::create_directories(dir / folder);
    for (int i = 0; i < 100; ++i) write_token_file((dir / folder / ("s" + std::to_string(1000 + i) + ".tok")).string(), tokens, 128);
  }
  const auto refused = run_command("ulimit -n 200 && " + trainer_command("--num_training_steps 1 --data " +
                                                                         (dir / "train").string() + " --eval_data " +
                                                                         (dir / "eval").string() + " --run_dir " +
                                                                         (dir / "run").string()));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(mentions(refused.output, "--eval_data: names 100 shards, each read through a file kept open, beside the "))
      << refused.output;
  EXPECT_TRUE(mentions(refused.output, "its hard limit, ulimit -Hn, is 200")) << refused.output;
}

// A shard rewritten in place with its size and first 4 KiB unchanged and other ids at its end: the
// resume is refused naming it (before: resumed without a word).
TEST(TokenFileChanged, ASameSizeChangePastItsFirst4KiBIsRefusedOnResume) {
  ScratchDir dir("same_size_change");
  std::vector<int64_t> tokens(100000);
  std::mt19937 random(3);
  for (int64_t& id : tokens) id = static_cast<int64_t>(random() % 128);
  const fs::path data = dir / "data.tok";
  write_token_file(data.string(), tokens, 128);
  const std::string flags = "--data " + data.string() + " --save_dir " + (dir / "ckpt").string();
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 2 --save_every 2 " + flags + " --run_dir " +
                                        (dir / "a").string()))
                .exit_code,
            0);
  for (size_t i = tokens.size() - 100; i < tokens.size(); ++i) tokens[i] = (tokens[i] + 1) % 128;
  write_token_file(data.string(), tokens, 128);
  const auto refused = run_command(trainer_command("--num_training_steps 4 --continue_from " + (dir / "ckpt").string() +
                                                   " " + flags + " --run_dir " + (dir / "b").string()));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(mentions(refused.output, "data.tok: the same size and first 4 KiB, but bytes further in differ"))
      << refused.output;
}

// SIGHUP (the terminal or ssh session went away) is a preemption: the step finishes, a checkpoint is
// saved and the run exits 0 (before: exit 129 with nothing saved).
TEST(Sighup, IsAPreemptionThatSaves) {
  ScratchDir dir("sighup");
  const fs::path run_dir = dir / "run";
  const auto result = testing::run_and_act(
      trainer_command("--num_training_steps 100000 --save_dir " + (dir / "ckpt").string() + " --run_dir " +
                      run_dir.string()),
      run_dir, [&] {
        const pid_t pid = testing::find_process(testing::trainer_binary().string(), run_dir, 0);
        return pid > 0 && ::kill(pid, SIGHUP) == 0;
      });
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(mentions(result.output, "SIGHUP")) << result.output;
  const auto preempted = testing::read_metrics_events(run_dir, "preempted");
  ASSERT_EQ(preempted.size(), 1u) << result.output;
  const int64_t step = preempted.at(0).at("step").get<int64_t>();
  EXPECT_TRUE(fs::exists(dir / "ckpt" / ("step_" + std::to_string(step)) / "manifest.json")) << result.output;
}

}  // namespace
}  // namespace llm::hostile_inputs_test
