// Interchange with transformers (issue 13): `trainer export` and `--init_from`, through the trainer
// binary on CPU, and transformers itself through the project's Python (tests/export_check.py).
//
// The data is a token file whose windows are all the same 17 tokens, so every batch of every run is
// the same batch whatever the data position: the first loss of a run started with --init_from from
// an export must then equal, bit for bit, the loss a run resumed from the exported checkpoint computes
// at its first step (both are the same weights on the same batch, before any update), at 1 and 2 ranks.
// An export of an earlier step gives another loss, so the check can fail. transformers' loss on that
// window, from LlamaForCausalLM.from_pretrained(DIR) with no flag, must equal the trainer's within fp32
// rounding, for a single-file and a sharded export (bf16: within bf16 rounding), and its parameters
// must be the checkpoint's (read with the README's recipe). Every refusal is exit 2 naming the key,
// tensor or flag (recorded for docs/errors.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "common/crc32c.h"
#include "common/folder_lock.h"
#include "common/errors.h"
#include "tests/export_fixture.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"
#include "data/token_file.h"
#include "checkpoint/interchange/export.h"
#include "checkpoint/interchange/hf_config.h"
#include "checkpoint/interchange/safetensors.h"

namespace llm::export_test {
namespace {

// --- the files --------------------------------------------------------------------------------------

TEST(Export, WritesTransformersFilesOneLinePerFile) {
  const Trained& t = trained();
  ASSERT_TRUE(fs::exists(t.exported / "model.safetensors")) << t.trained_output << t.export_output;
  for (const char* file : {"config.json", "generation_config.json"}) EXPECT_TRUE(fs::exists(t.exported / file)) << file;
  // The synthetic-free token file was written by the test, not `trainer prepare`: no tokenizer, said why.
  EXPECT_FALSE(fs::exists(t.exported / "tokenizer.model"));
  expect_mentions({0, t.export_output}, {"export: wrote", "model.safetensors (21 tensors", "no tokenizer exported",
                                         "periodic.tok.model", "in all"});
  const nlohmann::json config = read_json(t.exported / "config.json");
  EXPECT_EQ(config.at("architectures"), nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(config.at("model_type"), "llama");
  EXPECT_EQ(config.at("dtype"), "float32");
  EXPECT_EQ(config.at("hidden_size"), 32);
  EXPECT_EQ(config.at("intermediate_size"), 88);
  EXPECT_EQ(config.at("num_hidden_layers"), 2);
  EXPECT_EQ(config.at("num_attention_heads"), 2);
  EXPECT_EQ(config.at("num_key_value_heads"), 2);
  EXPECT_EQ(config.at("head_dim"), 16);
  EXPECT_EQ(config.at("vocab_size"), 128);
  EXPECT_EQ(config.at("max_position_embeddings"), 64);
  EXPECT_EQ(config.at("rms_norm_eps"), 1e-6);
  EXPECT_EQ(config.at("tie_word_embeddings"), false);
  EXPECT_EQ(config.at("hidden_act"), "silu");
  EXPECT_EQ(config.at("bos_token_id"), 0);
  EXPECT_EQ(config.at("eos_token_id"), 1);
  EXPECT_EQ(config.at("pad_token_id"), 127);  // GaLore's -1: the last row
  EXPECT_EQ(config.at("rope_parameters"), (nlohmann::json{{"rope_theta", 10000.0}, {"rope_type", "default"}}));
  EXPECT_EQ(config.at("transformers_version"), exported_transformers_version());

  // Sharded: every file within the limit unless one tensor alone is larger, the index names them all.
  const nlohmann::json index = read_json(t.sharded / "model.safetensors.index.json");
  std::set<std::string> files;
  int64_t total = 0;
  for (const auto& [name, file] : index.at("weight_map").items()) files.insert(file.get<std::string>());
  EXPECT_EQ(index.at("weight_map").size(), 21u);
  EXPECT_GT(files.size(), 3u);
  for (const std::string& file : files) {
    EXPECT_NE(t.sharded_output.find(file), std::string::npos) << file << " not reported in\n" << t.sharded_output;
    const SafetensorsFile shard((t.sharded / file).string());
    int64_t bytes = 0;
    for (const auto& [name, entry] : shard.entries()) bytes += static_cast<int64_t>(entry.nbytes());
    EXPECT_TRUE(bytes <= 20000 || shard.entries().size() == 1) << file << ": " << bytes << " bytes";
    total += bytes;
  }
  EXPECT_EQ(index.at("metadata").at("total_size"), total);
  EXPECT_FALSE(fs::exists(t.sharded / "model.safetensors"));
}

TEST(Export, SafetensorsRoundTripKeepsEveryBit) {
  ScratchDir dir("safetensors");
  std::vector<SafetensorsEntry> entries;
  std::vector<at::Tensor> tensors;
  for (int64_t size : {1, 7, 22, 1023}) {
    tensors.push_back(at::randn({size, 3}));
    entries.push_back({"t" + std::to_string(size), size == 7 ? at::kBFloat16 : at::kFloat, {size, 3}});
  }
  SafetensorsWriter writer((dir / "x.safetensors").string(), entries);
  for (size_t i = 0; i < tensors.size(); ++i) writer.write(entries[i].name, tensors[i]);
  const uint64_t bytes = writer.finish();
  EXPECT_EQ(bytes, fs::file_size(dir / "x.safetensors"));
  const SafetensorsFile file((dir / "x.safetensors").string());
  EXPECT_EQ(file.metadata().at("format"), "pt");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor read = file.read(entries[i].name);
    EXPECT_EQ(read.scalar_type(), entries[i].dtype);
    EXPECT_TRUE(at::equal(read, tensors[i].to(entries[i].dtype))) << entries[i].name;
  }
  // Header length is a multiple of 8, so every tensor starts aligned.
  uint64_t header = 0;
  std::ifstream((dir / "x.safetensors").string(), std::ios::binary).read(reinterpret_cast<char*>(&header), 8);
  EXPECT_EQ(header % 8, 0u);
}

TEST(Export, ByteSizesAreTransformersSpellings) {
  EXPECT_EQ(parse_byte_size("5GB"), 5'000'000'000ULL);
  EXPECT_EQ(parse_byte_size("500MB"), 500'000'000ULL);
  EXPECT_EQ(parse_byte_size("2GiB"), 2ULL << 30);
  EXPECT_EQ(parse_byte_size("20kb"), 20'000ULL);
  EXPECT_EQ(parse_byte_size("1.5GB"), 1'500'000'000ULL);
  EXPECT_EQ(parse_byte_size("12345"), 12345ULL);
  for (const char* bad : {"", "GB", "5XB", "-1", "0", "1.2.3GB"}) EXPECT_EQ(parse_byte_size(bad), 0u) << bad;
}

// --- transformers loads it ----------------------------------------------------------------------------

TEST(Export, TransformersLoadsItWithoutAFlagAndComputesTheTrainersLoss) {
  const fs::path python = testing::python();
  if (!fs::exists(python)) GTEST_SKIP() << "no Python environment at " << python;
  if (run_command(python.string() + " -c 'import transformers, safetensors'").exit_code != 0)
    GTEST_SKIP() << "transformers or safetensors is not importable from " << python;
  const Trained& t = trained();
  ASSERT_TRUE(fs::exists(t.sharded / "model.safetensors.index.json")) << t.sharded_output;
  // The trainer's loss on the step-4 weights: the first step of a run resumed from step 4.
  ScratchDir dir("export_python");
  const auto resumed = run_command(testing::trainer_launcher(1) + train_flags(t.data, 1) + " --continue_from " +
                                   t.checkpoints.string() + " --num_training_steps 5 --run_dir " + (dir / "run").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const double trainer_loss = first_train_loss(dir / "run", 5);

  std::string tokens;
  for (int64_t token : window_tokens()) tokens += (tokens.empty() ? "" : ",") + std::to_string(token);
  const auto checked = run_command(python.string() + " " + (testing::source_dir() / "tests/export_check.py").string() +
                                   " " + (testing::source_dir() / "README.md").string() + " " +
                                   (t.checkpoints / "step_4").string() + " " + tokens + " " + t.exported.string() +
                                   " " + t.sharded.string() + " " + t.bf16.string());
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  std::map<std::string, nlohmann::json> results;
  std::istringstream lines(checked.output);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line.front() == '{') {
      const nlohmann::json result = nlohmann::json::parse(line);
      results[result.at("dir").get<std::string>()] = result;
    }
  ASSERT_EQ(results.size(), 3u) << checked.output;
  for (const fs::path& folder : {t.exported, t.sharded, t.bf16}) {
    const nlohmann::json& result = results.at(folder.string());
    SCOPED_TRACE(folder.string());
    EXPECT_TRUE(result.at("missing").empty()) << result;
    EXPECT_TRUE(result.at("unexpected").empty()) << result;
    EXPECT_TRUE(result.at("mismatched").empty()) << result;
    EXPECT_EQ(result.at("parameters"), 21);
    EXPECT_EQ(result.at("checkpoint_tensors"), 21);
    const bool bf16 = folder == t.bf16;
    EXPECT_EQ(result.at("dtype"), bf16 ? "bfloat16" : "float32");
    // fp32: the same weights bit for bit, and the same loss up to summation order (the trainer's mean
    // runs over 4 identical rows, HF's over one, on the same CPU kernels). Measured: the same bits.
    // rtol 1e-6 (16 fp32 ulps) leaves room for another CPU's kernels, and is what catches config.json
    // errors on this window: rms_norm_eps 1e-5 for 1e-6 moves the loss by 6e-4, rope_theta 500000 for
    // 10000 by 2.3e-6 (measured). bf16: weights rounded to 8 bits of mantissa (2^-9 relative) moved
    // it by 4e-4 here: rtol 2e-2.
    EXPECT_LE(result.at("max_abs_diff_vs_checkpoint").get<double>(), bf16 ? 1e-2 : 0.0) << result;
    EXPECT_NEAR(result.at("loss").get<double>(), trainer_loss, (bf16 ? 2e-2 : 1e-6) * trainer_loss) << result;
  }
}

// --- --init_from ---------------------------------------------------------------------------------------

// Each rank's "--init_from DIR: read this rank's rows, N bytes (...) of the folder's M bytes" line: (N, M).
std::vector<std::pair<int64_t, int64_t>> init_from_reads(const std::string& output) {
  std::vector<std::pair<int64_t, int64_t>> reads;
  std::istringstream lines(output);
  const std::string read = "read this rank's rows, ", of = "of the folder's ";
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find(read), total = line.find(of);
    if (at == std::string::npos || total == std::string::npos) continue;
    reads.emplace_back(std::stoll(line.substr(at + read.size())), std::stoll(line.substr(total + of.size())));
  }
  return reads;
}

class InitFrom : public ::testing::TestWithParam<int> {};

TEST_P(InitFrom, FirstLossEqualsTheResumedCheckpointsBitwise) {
  const int ranks = GetParam();
  const Trained& t = trained();
  ASSERT_TRUE(fs::exists(t.exported / "model.safetensors")) << t.trained_output << t.export_output;
  ScratchDir dir("init_from_" + std::to_string(ranks));
  const std::string launcher = testing::trainer_launcher(ranks) + train_flags(t.data, ranks);
  const auto resumed = run_command(launcher + " --continue_from " + t.checkpoints.string() +
                                   " --num_training_steps 5 --run_dir " + (dir / "resumed").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto started = run_command(launcher + " --init_from " + t.exported.string() +
                                   " --num_training_steps 3 --run_dir " + (dir / "init").string());
  ASSERT_EQ(started.exit_code, 0) << started.output;
  const auto sharded = run_command(launcher + " --init_from " + t.sharded.string() +
                                   " --num_training_steps 1 --run_dir " + (dir / "init_sharded").string());
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  const auto earlier = run_command(launcher + " --init_from " + t.earlier.string() +
                                   " --num_training_steps 1 --run_dir " + (dir / "init_earlier").string());
  ASSERT_EQ(earlier.exit_code, 0) << earlier.output;

  // Each rank reads only its rows: the ranks' reads add up to the folder's weights (full_shard holds
  // every row once), each under them at 2 ranks.
  for (const auto* run : {&started, &sharded}) {
    const std::vector<std::pair<int64_t, int64_t>> reads = init_from_reads(run->output);
    ASSERT_EQ(reads.size(), static_cast<size_t>(ranks)) << run->output;
    int64_t total = 0;
    for (const auto& [read, weights] : reads) {
      total += read;
      EXPECT_EQ(weights, reads[0].second);
      if (ranks > 1) {
        EXPECT_LT(read, weights) << run->output;
      }
    }
    EXPECT_EQ(total, reads[0].second) << run->output;
  }

  const double expected = first_train_loss(dir / "resumed", 5);
  EXPECT_EQ(first_train_loss(dir / "init", 1), expected);
  EXPECT_EQ(first_train_loss(dir / "init_sharded", 1), expected);
  EXPECT_NE(first_train_loss(dir / "init_earlier", 1), expected);  // step 2's weights: the check can fail
  // A fresh run from step 0, trained on from there.
  const nlohmann::json start = testing::read_metrics_events(dir / "init", "start").at(0);
  EXPECT_EQ(start.at("start_step"), 0);
  EXPECT_EQ(start.at("run").at("init_from"), t.exported.string());
  EXPECT_LT(first_train_loss(dir / "init", 3), first_train_loss(dir / "init", 1));
}

INSTANTIATE_TEST_SUITE_P(Ranks, InitFrom, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "rank"; });

TEST(InitFromConfig, AcceptsTodaysAndOlderConfigKeysThatDoNotChangeTheMaths) {
  const Trained& t = trained();
  ScratchDir dir("init_from_keys");
  fs::copy(t.exported, dir / "folder");
  nlohmann::json config = read_json(dir / "folder/config.json");
  config["torch_dtype"] = "bfloat16";
  config["dtype"] = "bfloat16";
  config["transformers_version"] = "4.40.0";
  config["max_position_embeddings"] = 4096;
  config["use_cache"] = false;
  config["_name_or_path"] = "somewhere/else";
  config["architectures"] = {"LlamaForCausalLM"};
  config["rope_scaling"] = nullptr;
  write_json(dir / "folder/config.json", config);
  const auto result = run_command(testing::trainer_launcher(1) + train_flags(t.data, 1) + " --init_from " +
                                  (dir / "folder").string() + " --num_training_steps 1 --run_dir " + (dir / "run").string());
  EXPECT_EQ(result.exit_code, 0) << result.output;
}


// Two exports to one --to (issue 44: a float32 config.json beside bf16 weights, under a success
// message): while another process holds --to's lock, export is refused naming it and writes nothing.
TEST(Export, ASecondWriterOfOneFolderIsRefusedNamingTheFirst) {
  const Trained& t = trained();
  ScratchDir dir("export_lock");
  const fs::path to = dir / "out";
  {
    const std::unique_ptr<FolderLock> held = FolderLock::output(to, "--to");
    const auto refused = run_command(export_command("--from " + t.checkpoints.string() + " --to " + to.string()));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("--to " + to.string() + " is in use by another job (host "), std::string::npos)
        << refused.output;
    EXPECT_NE(refused.output.find("process " + std::to_string(::getpid())), std::string::npos) << refused.output;
    EXPECT_FALSE(fs::exists(to));
  }
  const auto ran = run_command(export_command("--from " + t.checkpoints.string() + " --to " + to.string()));
  EXPECT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_TRUE(fs::exists(to / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / ".out.trainer.lock"));
}

TEST(Export, OverwriteReplacesAnEarlierExportAndLeavesOtherFiles) {
  const Trained& t = trained();
  ScratchDir dir("export_overwrite");
  fs::copy(t.sharded, dir / "out");
  std::ofstream(dir / "out/notes.txt") << "mine";
  const auto result = run_command(export_command("--from " + t.checkpoints.string() + " --to " + (dir / "out").string() +
                                                 " --overwrite"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir / "out")) names.insert(entry.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "generation_config.json", "model.safetensors", "notes.txt"}));
}

TEST(Export, CopiesTheTokenizerItIsGivenAndNamesTheRunsWithoutFollowingIt) {
  ScratchDir dir("export_tokenizer");
  {
    std::ofstream text(dir / "text.txt");
    for (int line = 0; line < 300; ++line)
      text << "the quick brown fox " << line % 17 << " jumps over the lazy dog number " << line % 29 << "\n";
  }
  const std::string trainer = testing::trainer_binary().string();
  const auto prepared = run_command(trainer + " prepare --input " + (dir / "text.txt").string() + " --output " +
                                    (dir / "text.tok").string() + " --vocab_size 100");
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  const auto trained_run = run_command(testing::trainer_launcher(1) + " --config " + micro_config() +
                                       " --device cpu --data " + (dir / "text.tok").string() +
                                       " --max_length 16 --batch_size 2 --num_training_steps 1 --eval_every 0 "
                                       "--eval_batches 1 --eval_fraction 0.2 --save_dir " + (dir / "ckpt").string() +
                                       " --run_dir " + (dir / "run").string());
  ASSERT_EQ(trained_run.exit_code, 0) << trained_run.output;
  // Without --tokenizer nothing outside the checkpoint is read on the manifest's word (issue 44): the
  // output names the file to pass.
  const auto unnamed = run_command(trainer + " export --from " + (dir / "ckpt").string() + " --to " + (dir / "bare").string());
  ASSERT_EQ(unnamed.exit_code, 0) << unnamed.output;
  EXPECT_FALSE(fs::exists(dir / "bare/tokenizer.model"));
  const std::string suggestion = "--tokenizer " + (dir / "text.tok").string() + ".model";
  expect_mentions(unnamed, {suggestion.c_str(), "is not followed"});
  const auto exported = run_command(trainer + " export --from " + (dir / "ckpt").string() + " --to " + (dir / "out").string() +
                                    " --tokenizer " + (dir / "text.tok.model").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  std::ifstream original(dir / "text.tok.model", std::ios::binary), copy(dir / "out/tokenizer.model", std::ios::binary);
  const std::string original_bytes((std::istreambuf_iterator<char>(original)), std::istreambuf_iterator<char>());
  const std::string copy_bytes((std::istreambuf_iterator<char>(copy)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(original_bytes.empty());
  EXPECT_EQ(copy_bytes, original_bytes);
  // Not a SentencePiece model: refused by name.
  std::ofstream(dir / "not.model") << "not a model";
  const auto refused = run_command(trainer + " export --from " + (dir / "ckpt").string() + " --to " +
                                   (dir / "out2").string() + " --tokenizer " + (dir / "not.model").string());
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  expect_mentions(refused, {"not.model", "is neither a SentencePiece model nor a Hugging Face tokenizer.json"});
  EXPECT_FALSE(fs::exists(dir / "out2/model.safetensors")) << "checked before anything is written";
}

// A corpus prepared with a Hugging Face tokenizer.json (LLaMA 3's, GPT-2's) exports it (issue 44: it
// could never be exported, and a file that was not a SentencePiece model failed after the weights
// were written): tokenizer.json as it is, with tokenizer_config.json naming PreTrainedTokenizerFast,
// so transformers' AutoTokenizer encodes as the tokenizers library does; one larger than the model's
// vocabulary is exit 2 before anything is written.
TEST(Export, ATokenizerJsonIsExportedForAutoTokenizer) {
#ifdef TRAINER_PYTHON
  const std::string python = testing::python().string();
  if (run_command(python + " -c 'import tokenizers'").exit_code != 0) GTEST_SKIP() << "no tokenizers in " << python;
  const Trained& t = trained();
  ScratchDir dir("export_tokenizer_json");
  std::ofstream(dir / "make.py")
      << "import sys\nfrom tokenizers import Tokenizer, models, trainers, pre_tokenizers\n"
         "for size, path in ((100, sys.argv[1]), (300, sys.argv[2])):\n"
         "    tok = Tokenizer(models.BPE(unk_token='<unk>'))\n"
         "    tok.pre_tokenizer = pre_tokenizers.ByteLevel()\n"
         "    tok.train_from_iterator(['the old man walked to the river %d' % i for i in range(300)],\n"
         "                            trainers.BpeTrainer(vocab_size=size, special_tokens=['<unk>', '<s>', '</s>']))\n"
         "    tok.save(path)\n";
  const auto made = run_command(python + " " + (dir / "make.py").string() + " " + (dir / "small.json").string() + " " +
                                (dir / "large.json").string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto exported = run_command(export_command("--from " + t.checkpoints.string() + " --to " + (dir / "out").string() +
                                                   " --tokenizer " + (dir / "small.json").string()));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_EQ(testing::read_text(dir / "out/tokenizer.json"), testing::read_text(dir / "small.json"));
  EXPECT_EQ(read_json(dir / "out/tokenizer_config.json").at("tokenizer_class"), "PreTrainedTokenizerFast");
  EXPECT_FALSE(fs::exists(dir / "out/tokenizer.model"));
  if (run_command(python + " -c 'import transformers'").exit_code == 0) {
    const auto loaded = run_command(
        python + " -c \"import sys; from transformers import AutoTokenizer; from tokenizers import Tokenizer; "
                 "text = 'the old man walked to the river 7'; "
                 "a = AutoTokenizer.from_pretrained(sys.argv[1])(text)['input_ids']; "
                 "b = Tokenizer.from_file(sys.argv[2]).encode(text).ids; print('same' if a == b else (a, b))\" " +
        (dir / "out").string() + " " + (dir / "small.json").string());
    EXPECT_NE(loaded.output.find("same"), std::string::npos) << loaded.output;
  }
  const auto refused = run_command(export_command("--from " + t.checkpoints.string() + " --to " + (dir / "out2").string() +
                                                  " --tokenizer " + (dir / "large.json").string()));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  expect_mentions(refused, {"large.json", "--tokenizer", "has 300 pieces, more than the model's vocab_size 128"});
  EXPECT_FALSE(fs::exists(dir / "out2/model.safetensors")) << "checked before anything is written";
#else
  GTEST_SKIP() << "this build names no TRAINER_PYTHON";
#endif
}

}  // namespace
}  // namespace llm::export_test
