// `trainer export` and `--init_from` refused (issue 13, issue 44): each case exit 2 naming the key,
// tensor or flag (recorded for docs/errors.md), nothing written; on the run tests/export_fixture.h
// trains once for this file.
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

#include <sys/stat.h>
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

// --- refusals, each exit 2 naming what is wrong -------------------------------------------------------------

struct Refusal {
  std::string name;
  std::function<std::string(const Trained&, const fs::path& dir)> command;  // given a scratch folder
  std::vector<std::string> mentions;
};


// --init_from a copy of the single-file export, changed by `change` first.
std::string init_from_changed(const Trained& t, const fs::path& dir, const std::function<void(const fs::path&)>& change) {
  fs::copy(t.exported, dir / "folder");
  change(dir / "folder");
  return testing::trainer_launcher(1) + train_flags(t.data, 1) + " --init_from " + (dir / "folder").string() +
         " --num_training_steps 1 --run_dir " + (dir / "run").string();
}

std::function<void(const fs::path&)> set_config(const std::string& key, const nlohmann::json& value) {
  return [key, value](const fs::path& folder) {
    nlohmann::json config = read_json(folder / "config.json");
    config[key] = value;
    write_json(folder / "config.json", config);
  };
}

// Adds model.safetensors.index.json naming `shard` for model.embed_tokens.weight (made by `make`
// in the folder first, when given).
std::function<void(const fs::path&)> index_naming(const std::string& shard, std::function<void(const fs::path&)> make) {
  return [shard, make](const fs::path& folder) {
    if (make) make(folder / shard);
    write_json(folder / "model.safetensors.index.json",
               {{"metadata", {{"total_size", 0}}}, {"weight_map", {{"model.embed_tokens.weight", shard}}}});
  };
}

// Rewrites model.safetensors: `edit` changes the name -> tensor map first.
std::function<void(const fs::path&)> rewrite_tensors(const std::function<void(std::map<std::string, at::Tensor>&)>& edit) {
  return [edit](const fs::path& folder) {
    std::map<std::string, at::Tensor> tensors;
    {
      const SafetensorsFile file((folder / "model.safetensors").string());
      for (const auto& [name, entry] : file.entries()) tensors[name] = file.read(name);
    }
    edit(tensors);
    std::vector<SafetensorsEntry> entries;
    for (const auto& [name, tensor] : tensors) entries.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
    SafetensorsWriter writer((folder / "model.safetensors").string(), entries);
    for (const auto& [name, tensor] : tensors) writer.write(name, tensor);
    writer.finish();
  };
}

// `trainer export` of a copy of step_4 whose rank0.json says lm_head.weight is [size, size], with the
// manifest's CRC and size of that index updated to match.
std::string export_with_lm_head_shape(const Trained& t, const fs::path& dir, int64_t size) {
  fs::copy(t.checkpoints / "step_4", dir / "step_4");
  nlohmann::json index = read_json(dir / "step_4/rank0.json");
  index["tensors"]["lm_head.weight"]["shape"] = {size, size};
  const std::string text = index.dump();
  std::ofstream(dir / "step_4/rank0.json", std::ios::trunc) << text;
  nlohmann::json manifest = read_json(dir / "step_4/manifest.json");
  manifest["files"]["rank0.json"]["bytes"] = text.size();
  manifest["files"]["rank0.json"]["crc32c"] = crc_text(crc32c(text.data(), text.size()));
  write_json(dir / "step_4/manifest.json", manifest);
  return export_command("--from " + (dir / "step_4").string() + " --to " + (dir / "out").string());
}

const Refusal kRefusals[] = {
    {"export_missing_checkpoint",
     [](const Trained&, const fs::path& dir) { return export_command("--from " + (dir / "none").string() + " --to " + (dir / "out").string()); },
     {"--from", "no such folder"}},
    {"export_damaged_checkpoint",
     [](const Trained& t, const fs::path& dir) {
       fs::copy(t.checkpoints / "step_4", dir / "step_4");
       fs::resize_file(dir / "step_4/rank0.safetensors", fs::file_size(dir / "step_4/rank0.safetensors") / 2);
       return export_command("--from " + (dir / "step_4").string() + " --to " + (dir / "out").string());
     },
     {"not a complete checkpoint: rank0.safetensors: ", "bytes, but manifest.json lists"}},
    // An index that claims a tensor of [2^32, 2^32], or more elements than its parts hold, its CRC and
    // size updated in the manifest as a hostile editor would: refused before anything of that shape
    // is allocated (issue 44).
    {"export_index_claiming_a_huge_shape",
     [](const Trained& t, const fs::path& dir) { return export_with_lm_head_shape(t, dir, int64_t{1} << 32); },
     {"lm_head.weight", "holds more elements than any checkpoint does: the index is damaged"}},
    {"export_index_claiming_more_elements_than_its_parts",
     [](const Trained& t, const fs::path& dir) { return export_with_lm_head_shape(t, dir, int64_t{1} << 20); },
     {"lm_head.weight", "the ranks' parts do not tile it: the checkpoint is damaged"}},
    {"export_to_a_file",
     [](const Trained& t, const fs::path& dir) {
       std::ofstream(dir / "file") << "x";
       return export_command("--from " + t.checkpoints.string() + " --to " + (dir / "file").string());
     },
     {"--to", "exists and is a regular file, not a folder; it is never replaced"}},
    {"export_to_a_device",
     [](const Trained& t, const fs::path&) {
       return export_command("--from " + t.checkpoints.string() + " --to /dev/null --overwrite");
     },
     {"--to: /dev/null exists and is a character device, not a folder"}},
    {"export_overwrite_never_removes_a_folder",
     [](const Trained& t, const fs::path& dir) {
       fs::create_directories(dir / "out/config.json");  // a folder under a name an export writes
       return export_command("--from " + t.checkpoints.string() + " --to " + (dir / "out").string() + " --overwrite");
     },
     {"--to --overwrite: config.json: ", "is a folder, not a regular file; it is never replaced"}},
    {"export_to_a_non_empty_folder",
     [](const Trained& t, const fs::path& dir) {
       fs::create_directories(dir / "out");
       std::ofstream(dir / "out/notes.txt") << "mine";
       return export_command("--from " + t.checkpoints.string() + " --to " + (dir / "out").string());
     },
     {"--to", "notes.txt", "--overwrite"}},
    {"export_bad_shard_size",
     [](const Trained& t, const fs::path& dir) {
       return export_command("--from " + t.checkpoints.string() + " --to " + (dir / "out").string() + " --max_shard_size 5XB");
     },
     {"--max_shard_size", "5XB"}},
    // Checked before the weights are written (issue 44: refused only after them).
    {"export_tokenizer_of_neither_kind",
     [](const Trained& t, const fs::path& dir) {
       std::ofstream(dir / "notes.txt") << "not a tokenizer";
       return export_command("--from " + t.checkpoints.string() + " --to " + (dir / "out").string() + " --tokenizer " +
                             (dir / "notes.txt").string());
     },
     {"notes.txt: --tokenizer: is neither a SentencePiece model nor a Hugging Face tokenizer.json",
      "export writes the one as tokenizer.model and the other as tokenizer.json"}},
    {"export_with_a_training_flag",
     [](const Trained& t, const fs::path& dir) {
       return testing::trainer_binary().string() + " --lr 0.1 export --from " + t.checkpoints.string() + " --to " +
              (dir / "out").string();
     },
     {"--lr", "is a training flag"}},
    {"init_from_with_continue_from",
     [](const Trained& t, const fs::path& dir) {
       return testing::trainer_launcher(1) + train_flags(t.data, 1) + " --init_from " + t.exported.string() +
              " --continue_from " + t.checkpoints.string() + " --num_training_steps 6 --run_dir " + (dir / "run").string();
     },
     {"--init_from / --continue_from", "give one"}},
    {"init_from_other_hidden_size",
     [](const Trained& t, const fs::path& dir) { return init_from_changed(t, dir, set_config("hidden_size", 64)); },
     {"config.json: hidden_size", "64 there, 32 in --config llama_micro"}},
    {"init_from_other_rope_theta",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, set_config("rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}));
     },
     {"rope_parameters.rope_theta", "500000 there, 10000 in --config"}},
    {"init_from_rope_scaling_yarn",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, set_config("rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 10000.0}}));
     },
     {"rope_parameters.rope_type", "we do not run RoPE scaling yarn"}},
    {"init_from_rope_scaling_llama3_transformers4",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, set_config("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}));
     },
     {"rope_scaling.rope_type", "we do not run RoPE scaling llama3"}},
    {"init_from_other_rms_norm_eps",
     [](const Trained& t, const fs::path& dir) { return init_from_changed(t, dir, set_config("rms_norm_eps", 1e-5)); },
     {"rms_norm_eps", "1e-05 there, 1e-06 in --config"}},
    {"init_from_tied_embeddings",
     [](const Trained& t, const fs::path& dir) { return init_from_changed(t, dir, set_config("tie_word_embeddings", true)); },
     {"tie_word_embeddings", "true there, false in --config"}},
    {"init_from_other_hidden_act",
     [](const Trained& t, const fs::path& dir) { return init_from_changed(t, dir, set_config("hidden_act", "gelu")); },
     {"hidden_act", "\"gelu\" there"}},
    {"init_from_missing_tensor",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, rewrite_tensors([](auto& tensors) { tensors.erase("model.layers.1.mlp.up_proj.weight"); }));
     },
     {"has no tensor model.layers.1.mlp.up_proj.weight"}},
    {"init_from_extra_tensor",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, rewrite_tensors([](auto& tensors) {
         tensors["model.layers.0.self_attn.q_proj.bias"] = at::zeros({32});
       }));
     },
     {"model.layers.0.self_attn.q_proj.bias", "has no parameter for"}},
    {"init_from_wrong_shape",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, rewrite_tensors([](auto& tensors) {
         tensors["lm_head.weight"] = tensors["lm_head.weight"].slice(0, 0, 100).contiguous();
       }));
     },
     {"lm_head.weight", "shape [100, 32] there, [128, 32] in --config"}},
    {"init_from_non_finite_weight",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, rewrite_tensors([](auto& tensors) {
         tensors["model.layers.1.mlp.up_proj.weight"][5][3] = NAN;
         tensors["model.layers.1.mlp.up_proj.weight"][7][0] = INFINITY;
       }));
     },
     {"model.safetensors: model.layers.1.mlp.up_proj.weight: holds 2 non-finite value(s) (NaN or inf), the first nan in "
      "row 5", "Pass --init_from a folder of finite weights"}},
    {"init_from_truncated_safetensors",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, [](const fs::path& folder) {
         fs::resize_file(folder / "model.safetensors", fs::file_size(folder / "model.safetensors") - 100);
       });
     },
     {"model.safetensors", "truncated"}},
    {"init_from_pytorch_bin_only",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, [](const fs::path& folder) {
         fs::rename(folder / "model.safetensors", folder / "pytorch_model.bin");
       });
     },
     {"pytorch_model.bin", "safe_serialization=True"}},
    // A shard name read from the index is a plain name inside the folder, and the shard a regular
    // file (issue 44, common/input_paths.h): before, ".." was opened as a shard (the folder above).
    {"init_from_index_names_dot_dot",
     [](const Trained& t, const fs::path& dir) { return init_from_changed(t, dir, index_naming("..", nullptr)); },
     {"model.safetensors.index.json: weight_map.model.embed_tokens.weight: \"..\" is \"..\": not a plain file name "
      "inside the folder"}},
    {"init_from_index_names_a_path",
     [](const Trained& t, const fs::path& dir) { return init_from_changed(t, dir, index_naming("../folder/model.safetensors", nullptr)); },
     {"weight_map.model.embed_tokens.weight: \"../folder/model.safetensors\" holds a '/'"}},
    {"init_from_shard_a_fifo",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, index_naming("shard.safetensors", [](const fs::path& shard) {
         ::mkfifo(shard.c_str(), 0600);
       }));
     },
     {"shard.safetensors is a fifo, not a regular file (a shard of the weights)"}},
    {"init_from_single_file_a_link_to_dev_zero",
     [](const Trained& t, const fs::path& dir) {
       return init_from_changed(t, dir, [](const fs::path& folder) {
         fs::remove(folder / "model.safetensors");
         fs::create_symlink("/dev/zero", folder / "model.safetensors");
       });
     },
     {"model.safetensors is a symbolic link to /dev/zero, a character device, not a regular file"}},
    {"init_from_not_a_folder",
     [](const Trained& t, const fs::path& dir) {
       return testing::trainer_launcher(1) + train_flags(t.data, 1) + " --init_from " + (dir / "none").string() +
              " --run_dir " + (dir / "run").string();
     },
     {"--init_from", "does not exist"}},
};

void PrintTo(const Refusal& refusal, std::ostream* out) { *out << refusal.name; }

class Refused : public ::testing::TestWithParam<Refusal> {};

TEST_P(Refused, ExitsTwoNamingIt) {
  const Refusal& refusal = GetParam();
  const Trained& t = trained();
  ASSERT_TRUE(fs::exists(t.exported / "model.safetensors")) << t.trained_output << t.export_output;
  ScratchDir dir("export_refused_" + refusal.name);
  const auto result = run_command(refusal.command(t, dir.path()));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  for (const std::string& part : refusal.mentions)
    EXPECT_NE(result.output.find(part), std::string::npos) << part << " in:\n" << result.output;
  EXPECT_FALSE(fs::exists(dir / "out/model.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(Cases, Refused, ::testing::ValuesIn(kRefusals), [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace llm::export_test
