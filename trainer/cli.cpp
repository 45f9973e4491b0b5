// parse_command_line (trainer/cli.h): the flags of the verbs other than training, and the order of
// events: add every flag, parse, then check and finish what the chosen verb read. The training flags
// are trainer/training_flags.h's; how a flag's text becomes a value is trainer/flag_values.h's.
#include "trainer/cli.h"

#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "trainer/flag_values.h"
#include "trainer/training_flags.h"

namespace llm {
namespace {

// `trainer estimate`: at most this many ranks (each is simulated and printed: a million take half a
// minute and 80 MB of output) and at most this many GiB of memory (1 PiB).
constexpr int kMaxEstimateRanks = 65536;
constexpr double kMaxEstimateGib = 1048576;

// The verbs other than training, and what parse_command_line asks them after parsing.
struct Verbs {
  CLI::App* prepare = nullptr;
  CLI::App* report = nullptr;
  CLI::App* estimate = nullptr;
  CLI::App* export_model = nullptr;
  CLI::Option* tokenizer = nullptr;      // prepare: exactly one of --tokenizer and --vocab_size
  CLI::Option* vocab_size = nullptr;
  CLI::Option* context_sweep = nullptr;  // report: only with --techniques
  std::vector<CLI::Option*> fit_only;    // estimate: flags that only shape --fit's suggestions
  std::vector<CLI::Option*> rates;       // estimate: the rates --fit's costs and the step time use
  CLI::Option* profile_cache = nullptr;  // estimate: only with --profile
  std::string max_shard_size = "5GB";    // export: read as text, turned into bytes after parsing
};

// `trainer prepare`: text files into a token file.
void add_prepare_verb(CLI::App& app, NumberFlags& numbers, PrepareOptions& prepare, Verbs& verbs) {
  CLI::App* prepare_app = app.add_subcommand(
      "prepare", "Tokenise text or JSON Lines files (plain, gzip or zstd) into a token file for --data (SentencePiece).");
  prepare_app->get_formatter()->column_width(34);
  prepare_app->add_option("--input", prepare.inputs,
                          "files to tokenise: text (a document a line) or JSON Lines (*.jsonl, *.json), each "
                          "plain, .gz or .zst; several files, or a quoted glob such as 'c4/en/*.json.gz'")
      ->required();
  prepare_app->add_option("--text_key", prepare.text_key, "JSON Lines: the key that holds each record's text")
      ->capture_default_str();
  prepare_app->add_option("--output", prepare.output,
                          "token file to write; with --shard_tokens, the folder of shards")->required();
  numbers.add(*prepare_app, "--shard_tokens", prepare.shard_tokens,
              "write shards of N tokens each (shard_000000.tok, ...) and index.json into the --output folder; 0: one file",
              NumberRange<int64_t>{0, kMaxShardTokens, "0 (one file) or an integer in [" + std::to_string(kMinShardTokens) +
                                                           ", " + std::to_string(kMaxShardTokens) + "]"});
  prepare_app->add_option("--format", prepare.format,
                          "trainer (ours, .tok), llmc (llm.c's .bin: uint16 ids up to a 65,536 vocabulary, else uint32) "
                          "or megatron (Megatron-LM's .bin and .idx: a sequence per document, for --window_start "
                          "document; shards end at the first document end past --shard_tokens)")
      ->check(CLI::IsMember({"trainer", "llmc", "megatron"}))
      ->capture_default_str();
  verbs.tokenizer = prepare_app->add_option(
      "--tokenizer", prepare.tokenizer, "existing SentencePiece model to encode with");
  verbs.vocab_size = numbers.add(
      *prepare_app, "--vocab_size", prepare.vocab_size,
      "train a new SentencePiece model of this vocabulary size (saved as OUTPUT.model)",
      NumberRange<int64_t>{kMinVocabSize, kMaxVocabSize,
                           "an integer in [" + std::to_string(kMinVocabSize) + ", " + std::to_string(kMaxVocabSize) +
                               "]: SentencePiece reserves 3 pieces (<unk>, <s>, </s>) and counts in int32"});
  prepare_app->add_option("--model_type", prepare.model_type,
                          "SentencePiece model type when training one")
      ->check(CLI::IsMember({"bpe", "unigram"}))
      ->capture_default_str();
  prepare_app->add_flag("--overwrite", prepare.overwrite,
                        "replace an existing --output (and OUTPUT.model); without it they are kept "
                        "and prepare stops");
  verbs.prepare = prepare_app;
}

// `trainer report`: the memory ledgers of run folders, or the techniques table.
void add_report_verb(CLI::App& app, ReportOptions& report, Verbs& verbs) {
  CLI::App* report_app = app.add_subcommand(
      "report", "Aggregate the memory ledgers of run folders: Markdown tables and SVG plots side by side.");
  report_app->get_formatter()->column_width(34);
  report_app->add_option("run_dirs", report.run_dirs,
                         "run folders (--run_dir of a training run): metrics.jsonl and memory.rank<R>.jsonl")
      ->required();
  report_app->add_option("--out", report.out,
                         "folder for memory_report.md and memory/*.svg (with --techniques: techniques.md "
                         "and techniques/*.svg)")
      ->capture_default_str();
  report_app->add_flag("--techniques", report.techniques,
                       "the techniques table instead: the run folders are runs of one workload with different "
                       "memory techniques, the first of each world size the baseline of the shares");
  verbs.context_sweep =
      report_app->add_option("--context_sweep", report.context_sweep,
                             "with --techniques: runs of one workload at different context lengths (and dtypes): "
                             "the forward-only and training-step peaks over the context length");
  verbs.report = report_app;
}

// `trainer estimate`: each rank's peak memory for the training flags, without running.
void add_estimate_verb(CLI::App& app, NumberFlags& numbers, EstimateOptions& estimate, Verbs& verbs) {
  CLI::App* estimate_app = app.add_subcommand(
      "estimate",
      "Predict each rank's peak memory by category for a config, training flags and a world size, "
      "without running: trainer estimate --config FILE [training flags] --world_size N. The device is "
      "--device's: cpu, or cuda (also for auto)");
  estimate_app->get_formatter()->column_width(34);
  estimate_app->fallthrough();  // the training flags (--config, --optimizer, ...) are the parent's
  // Each range said in words, so a bad value gets a sentence rather than CLI11's "not in range
  // 0.000000 to 1.797e308", and 10^11 ranks is "got 100000000000" rather than "Could not convert".
  const std::string ranks_range = "an integer from 1 to " + std::to_string(kMaxEstimateRanks);
  // GiB flags: a finite, positive size up to 1 PiB (far beyond it the byte count overflows).
  const std::string gib_range = "a number of GiB above 0 and at most " +
                                std::to_string(static_cast<int64_t>(kMaxEstimateGib)) + " (1 PiB)";
  const double smallest_gib = std::numeric_limits<double>::denorm_min();
  numbers.add(*estimate_app, "--world_size", estimate.world_size, "ranks to estimate for",
              NumberRange<int>{1, kMaxEstimateRanks,
                               ranks_range + ": the ranks to estimate for (the estimate simulates and lists each one)"})
      ->capture_default_str();
  numbers.add(*estimate_app, "--memory_budget_gib", estimate.memory_budget_gib,
              "memory per rank, GiB (e.g. 24): say whether each rank's peak fits",
              NumberRange<double>{smallest_gib, kMaxEstimateGib,
                                  gib_range + ": one rank's device memory (leave it out for no verdict)"});
  numbers.add(*estimate_app, "--ranks_per_node", estimate.ranks_per_node,
              "ranks sharing one node's host memory (consecutive ranks); default: all on one node",
              NumberRange<int>{1, kMaxEstimateRanks,
                               ranks_range + ": the ranks on one node (leave it out for every rank on one node)"});
  numbers.add(*estimate_app, "--node_memory_gib", estimate.node_memory_gib,
              "a node's RAM, GiB, for the host verdict; default: this machine's",
              NumberRange<double>{smallest_gib, kMaxEstimateGib,
                                  gib_range + ": one node's RAM (leave it out for this machine's)"});
  estimate_app->add_flag("--json", estimate.json, "print the estimate (every phase of every rank) as JSON");
  estimate_app->add_flag("--fit", estimate.fit,
                         "with --memory_budget_gib: the memory levers to add to this command so it fits, ranked by "
                         "what they cost (memory/estimate_fit.h); exit 2 naming the smallest peak when nothing fits");
  verbs.fit_only.push_back(estimate_app->add_flag("--fit_precision", estimate.fit_precision,
                         "--fit: also try bf16 (--dtype bfloat16 --precision mixed, and pure) on an fp32 command; it "
                         "changes the arithmetic, so it ranks after every choice that keeps fp32 at the same cost"));
  verbs.fit_only.push_back(numbers.add(*estimate_app, "--host_budget_gib", estimate.host_budget_gib,
              "--fit: host memory per node, GiB; default: --node_memory_gib, else this machine's RAM",
              NumberRange<double>{smallest_gib, kMaxEstimateGib, gib_range + ": one node's host memory for --fit"}));
  const std::string rate_range = "a number above 0 and at most 1e6";
  numbers.add(*estimate_app, "--device_tflops", estimate.device_tflops,
              "the device's sustained TFLOP/s: the step time (and --fit's ranking by it) without --profile; default 200 "
              "on CUDA, 0.07 on a CPU",
              NumberRange<double>{smallest_gib, 1e6, rate_range + " (TFLOP/s)"});
  verbs.rates.push_back(numbers.add(*estimate_app, "--pcie_gbs", estimate.pcie_gbs, "host-device bandwidth, GB/s, for offload (--fit, the step time)",
              NumberRange<double>{smallest_gib, 1e6, rate_range + " (GB/s)"})
      ->capture_default_str());
  verbs.rates.push_back(numbers.add(*estimate_app, "--inter_node_gbs", estimate.inter_node_gbs,
              "a node's link to the other nodes, GB/s each way: the step time's, and --fit's for the sharding choices "
              "across nodes (hybrid_shard and its group size, --shard_optimizer_across_groups, --backward_gather_size)",
              NumberRange<double>{smallest_gib, 1e6, rate_range + " (GB/s)"})
      ->capture_default_str());
  verbs.rates.push_back(numbers.add(*estimate_app, "--host_gbs", estimate.host_gbs,
              "the host step's GB/s per rank, for offload's host step (--fit, the step time; build/bench/adamw_bench "
              "measures it); default: 8 GB/s per core of the rank's share of its node (--host_cores), at most 200",
              NumberRange<double>{smallest_gib, 1e6, rate_range + " (GB/s)"}));
  verbs.rates.push_back(numbers.add(*estimate_app, "--host_cores", estimate.host_cores,
              "a node's cores, for the host step's default rate (--host_gbs) and the step time's threads; default: "
              "this machine's",
              NumberRange<int>{1, 1 << 20, "a core count in [1, 1048576]"}));
  numbers.add(*estimate_app, "--profile", estimate.profile_seconds,
              "seconds to time each unit's forward and backward and the optimizer on this machine's device for the "
              "step time (memory/step_time.h), and for --fit's ranking (once for each micro-batch it tries); default: "
              "none, the matmuls at --device_tflops",
              NumberRange<double>{smallest_gib, 3600, "a number of seconds above 0 and at most 3600"});
  verbs.profile_cache = estimate_app->add_option(
      "--profile_cache", estimate.profile_cache,
      "with --profile: keep the profile in FILE (JSON) and take it from there when an earlier estimate of the same "
      "units (device, threads, micro-batch, dtype, precision, --profile seconds, model) measured them, so that "
      "estimates of several commands price them with one measurement");
  verbs.rates.push_back(numbers.add(*estimate_app, "--intra_node_gbs", estimate.intra_node_gbs,
              "the links inside a node, GB/s each way per rank, for the step time; default 2 on a CPU (MPI's shared "
              "memory), 150 on CUDA",
              NumberRange<double>{smallest_gib, 1e6, rate_range + " (GB/s)"}));
  verbs.rates.push_back(numbers.add(*estimate_app, "--link_latency_us", estimate.link_latency_us,
              "each ring step's latency, microseconds, for the step time; default 20 on a CPU, 10 on CUDA",
              NumberRange<double>{smallest_gib, 1e6, "a number above 0 and at most 1e6 (microseconds)"}));
  verbs.rates.push_back(numbers.add(*estimate_app, "--collective_wait_us", estimate.collective_wait_us,
              "each collective's wait for the last rank to arrive, microseconds, for the step time (ranks that share "
              "cores arrive apart; `mpirun -np N build/bench/communicator_bench --compute_ms MS` measures it); default 0",
              NumberRange<double>{0, 1e7, "a number of microseconds in [0, 1e7]"}));
  verbs.rates.push_back(estimate_app->add_option(
      "--collective_table", estimate.collective_table,
      "collectives measured inside a node (the JSON lines `mpirun -np N build/bench/communicator_bench --jsonl FILE` "
      "writes): the step time takes each collective inside a node at its measured time for its size, in place of "
      "--intra_node_gbs and --link_latency_us"));
  verbs.rates.push_back(estimate_app->add_option(
      "--collective_table_between", estimate.collective_table_between,
      "the same measured over ranks on several nodes (e.g. mpirun -np 4 over 2 nodes): the step time takes each "
      "collective whose ranks span nodes at its measured time, hybrid's rings across the groups once for each of "
      "a node's ranks (they share its link), in place of --inter_node_gbs"));
  verbs.rates.push_back(estimate_app->add_option(
      "--collective_table_across", estimate.collective_table_across,
      "hybrid's collectives across the groups measured as the run makes them, every rank of a node running its ring "
      "across the nodes at once (mpirun -np 4 over 2 nodes, communicator_bench --group_size 2 --groups_strided): the "
      "step time takes the all-reduce (with --shard_optimizer_across_groups the reduce-scatter and the all-gather) at "
      "its measured time, in place of --collective_table_between"));
  verbs.estimate = estimate_app;
}

// `trainer export`: a checkpoint as a transformers folder.
void add_export_verb(CLI::App& app, ExportOptions& exported, Verbs& verbs) {
  CLI::App* export_app = app.add_subcommand(
      "export", "Write a checkpoint as a transformers folder (config.json, model.safetensors, the tokenizer) that "
                "LlamaForCausalLM.from_pretrained loads: trainer export --from CHECKPOINT --to DIR.");
  export_app->get_formatter()->column_width(34);
  export_app->add_option("--from", exported.from, "a checkpoint folder, or a --save_dir (its newest intact step_<N>)")
      ->required();
  export_app->add_option("--to", exported.to, "the folder to write: new or empty (see --overwrite)")->required();
  export_app->add_option("--dtype", exported.dtype, "dtype of the exported tensors")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  export_app->add_option("--max_shard_size", verbs.max_shard_size,
                         "largest safetensors file, as transformers: 5GB, 500MB, 2GiB or bytes; above it the "
                         "tensors go into model-0000K-of-0000N.safetensors and an index")
      ->capture_default_str();
  export_app->add_option("--tokenizer", exported.tokenizer,
                         "the tokenizer the data was encoded with: a SentencePiece model (exported as tokenizer.model) or "
                         "a Hugging Face tokenizer.json (exported as tokenizer.json with tokenizer_config.json); default: "
                         "the one `trainer prepare` trained beside the run's token file, when there is one");
  export_app->add_flag("--overwrite", exported.overwrite,
                       "write into a non-empty --to, replacing an earlier export's files (others are left alone)");
  verbs.export_model = export_app;
}

// A verb other than training given a training flag: exit 2 naming the flag and what the verb takes.
void refuse_training_flags(const TrainingFlags& training, const std::string& takes) {
  for (const CLI::Option* flag : training.all)
    if (flag->count() > 0) fail_user(kCommandLine, flag->get_name(), "is a training flag; " + takes);
}

// `trainer prepare`: no training flag, and exactly one of --tokenizer and --vocab_size.
void check_prepare_command(const Verbs& verbs, const TrainingFlags& training) {
  refuse_training_flags(
      training, "`trainer prepare` takes --input, --text_key, --output, --shard_tokens, --format, --tokenizer or --vocab_size, --model_type and --overwrite");
  if ((verbs.tokenizer->count() > 0) == (verbs.vocab_size->count() > 0))
    fail_user(kCommandLine, "--tokenizer / --vocab_size",
              "`trainer prepare` needs exactly one of the two: --tokenizer MODEL to encode with "
              "an existing SentencePiece model, or --vocab_size N to train a new one (got " +
                  std::string(verbs.tokenizer->count() > 0 ? "both" : "neither") + ")");
}

// `trainer report`: no training flag, and --context_sweep only with --techniques.
void check_report_command(const Verbs& verbs, const TrainingFlags& training, const ReportOptions& report) {
  refuse_training_flags(
      training, "`trainer report` takes run folders and --out (each run's settings come from its metrics.jsonl)");
  if (verbs.context_sweep->count() > 0 && !report.techniques)
    fail_user(kCommandLine, "--context_sweep",
              "belongs to the techniques report: add --techniques (the run folders are then the technique runs)");
}

// `trainer export`: no training flag, and --max_shard_size read as a size.
void finish_export_command(const Verbs& verbs, const TrainingFlags& training, ExportOptions& exported) {
  refuse_training_flags(
      training,
      "`trainer export` takes --from, --to, --dtype, --max_shard_size, --tokenizer and --overwrite (the model "
      "comes from the checkpoint)");
  try {
    exported.max_shard_size = parse_byte_size(verbs.max_shard_size);  // 0: not a size, or outside [1, 2^64)
  } catch (const std::exception&) {  // std::stod of "." (as in ".GB")
    exported.max_shard_size = 0;
  }
  if (exported.max_shard_size == 0)
    fail_user(kCommandLine, "--max_shard_size",
              "expected a size of at least 1 byte and below 1.8e19 bytes (16 EiB): 5GB, 500MB, 2GiB or a number "
              "of bytes (got \"" + verbs.max_shard_size + "\")");
}

}  // namespace

Command parse_command_line(int argc, const char* const* argv) {
  Command command;

  CLI::App app{"LLaMA pre-training in C++ over LibTorch: memory-lean, sharded across MPI ranks.\n"
               "Train: trainer --config configs/llama_60m.json [flags]. "
               "Make a token file: trainer prepare --help.",
               "trainer"};
  app.get_formatter()->column_width(34);
  // A repeated flag takes its last value (argparse's rule), for this app and, inherited, for every
  // subcommand. A vector option (prepare's --input) still keeps all its values: TakeLast trims to
  // the number of values an option expects, which for a vector is unbounded.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  NumberFlags numbers;  // every numeric flag of every subcommand
  TrainingFlags training(command.run);  // named as GaLore's torchrun_main.py where it has one
  add_training_flags(app, numbers, training, command.run);
  Verbs verbs;
  add_prepare_verb(app, numbers, command.prepare, verbs);
  add_report_verb(app, command.report, verbs);
  add_estimate_verb(app, numbers, command.estimate, verbs);
  add_export_verb(app, command.export_options, verbs);

  numbers.check_every_number_is_ours(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    command.kind = Command::Kind::help;
    command.help_text = app.help();  // the selected subcommand's help when there is one
    return command;
  } catch (const CLI::CallForAllHelp&) {
    command.kind = Command::Kind::help;
    command.help_text = app.help("", CLI::AppFormatMode::All);
    return command;
  } catch (const CLI::ParseError& error) {
    const char* help = verbs.prepare->parsed()        ? "trainer prepare --help"
                       : verbs.report->parsed()       ? "trainer report --help"
                       : verbs.estimate->parsed()     ? "trainer estimate --help"
                       : verbs.export_model->parsed() ? "trainer export --help"
                                                      : "trainer --help";
    fail_user(kCommandLine, "",
              std::string(error.what()) + " (run `" + help + "` for the flags and their values)");
  }

  collect_repeated_flags(app, command.warnings);
  if (verbs.prepare->parsed()) {
    check_prepare_command(verbs, training);
    command.kind = Command::Kind::prepare;
    return command;
  }
  if (verbs.report->parsed()) {
    check_report_command(verbs, training, command.report);
    command.kind = Command::Kind::report;
    return command;
  }
  if (verbs.export_model->parsed()) {
    finish_export_command(verbs, training, command.export_options);
    command.kind = Command::Kind::export_model;
    return command;
  }
  if (verbs.estimate->parsed() && verbs.profile_cache->count() > 0 && command.estimate.profile_cache.empty())
    fail_user(kCommandLine, "--profile_cache", "names no file: give the JSON file to keep the profile in");
  if (verbs.estimate->parsed() && verbs.profile_cache->count() > 0 && command.estimate.profile_seconds <= 0)
    fail_user(kCommandLine, "--profile_cache",
              "keeps what --profile measures, and this estimate has no --profile: add --profile SECONDS, or leave it out");
  if (verbs.estimate->parsed() && !command.estimate.fit) {
    for (const CLI::Option* flag : verbs.fit_only)  // given without --fit, it would be silently unused
      if (flag->count() > 0)
        fail_user(kCommandLine, flag->get_name(),
                  "only shapes what --fit suggests, and this estimate has no --fit: add --fit --memory_budget_gib G, "
                  "or leave it out");
    const bool timed = command.estimate.profile_seconds > 0 || command.estimate.device_tflops > 0;
    for (const CLI::Option* flag : verbs.rates)  // likewise without --fit and without the step time
      if (flag->count() > 0 && !timed)
        fail_user(kCommandLine, flag->get_name(),
                  "only shapes --fit's costs and the step time, and this estimate has neither: add --profile SECONDS "
                  "(or --device_tflops T) for the step time, --fit --memory_budget_gib G for the levers, or leave it out");
  }
  apply_training_flags(app, training, verbs.estimate->parsed(), command.run, command.warnings);
  command.kind = verbs.estimate->parsed() ? Command::Kind::estimate : Command::Kind::train;
  return command;
}

nlohmann::json resolved_config_json(const ModelConfig& model, const RunConfig& run) {
  return nlohmann::json{
      {"model",
       {{"name", model.name},
        {"num_parameters", model.num_parameters()},
        {"config", model.to_json()}}},
      {"run", run.to_json()},
  };
}

}  // namespace llm
