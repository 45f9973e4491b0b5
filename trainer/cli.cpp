#include "trainer/cli.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace llm {
namespace {

constexpr const char* kCommandLine = "command line";
// `trainer estimate`: at most this many ranks (each is simulated and printed: a million take half a
// minute and 80 MB of output) and at most this many GiB of memory (1 PiB).
constexpr int kMaxEstimateRanks = 65536;
constexpr double kMaxEstimateGib = 1048576;

// The text spelling of each enum is the one to_string() gives, so help, flags and JSON agree.
template <typename Enum>
std::map<std::string, Enum> spellings(std::initializer_list<Enum> values) {
  std::map<std::string, Enum> by_name;
  for (Enum value : values) by_name.emplace(to_string(value), value);
  return by_name;
}

template <typename Enum>
std::vector<std::string> names_of(const std::map<std::string, Enum>& by_name) {
  std::vector<std::string> names;
  for (const auto& entry : by_name) names.push_back(entry.first);
  return names;
}

// An enum flag is read as a string restricted to its spellings, converted after parsing.
template <typename Enum>
struct EnumFlag {
  std::map<std::string, Enum> by_name;
  std::string text;

  EnumFlag(std::initializer_list<Enum> values, Enum initial)
      : by_name(spellings(values)), text(to_string(initial)) {}
  CLI::Option* add(CLI::App& app, const char* flag, const char* help) {
    return app.add_option(flag, text, help)->check(CLI::IsMember(names_of(by_name)))
        ->capture_default_str();
  }
  Enum value() const { return by_name.at(text); }
};

// ---- Numbers --------------------------------------------------------------------------------------
// Every number on the command line is read by read_number: the whole text, in decimal, within the
// range of its field's type or the narrower range a flag gives. CLI11's own conversion reads none of
// them: its strtoll clamps 99999999999999999999 to INT64_MAX, reads 010 as octal and 0x10 as hex,
// its strtoull wraps -1 to 2^64-1, and its strtold takes inf, nan and 1e999 (inf). A text outside is
// a UserError naming the flag, the text as typed and the range. Ranges that depend on other flags
// or on the model stay with validate_run_config.

template <typename Number>
struct NumberRange {
  Number lowest = std::numeric_limits<Number>::lowest();
  Number highest = std::numeric_limits<Number>::max();
  // The message's "expected ...", when the bounds alone do not say what the flag takes.
  std::string words;
};

template <typename Number>
std::string number_text(Number value) {
  if constexpr (std::is_floating_point_v<Number>) return format_number(value);
  else return std::to_string(value);
}

// What a flag takes, for its message: the words it gives, else its bounds when narrower than its
// type's; at the type's own bounds only the kind of number (the "got" then says which end was passed).
template <typename Number>
std::string range_words(const NumberRange<Number>& range) {
  if (!range.words.empty()) return range.words;
  const bool whole_type = range.lowest == std::numeric_limits<Number>::lowest() &&
                          range.highest == std::numeric_limits<Number>::max();
  if constexpr (std::is_floating_point_v<Number>) {
    return whole_type ? "a finite number"
                      : "a number from " + format_number(range.lowest) + " to " + format_number(range.highest);
  } else {
    if (whole_type) return std::is_unsigned_v<Number> ? "an integer >= 0" : "an integer";
    return "an integer from " + std::to_string(range.lowest) + " to " + std::to_string(range.highest);
  }
}

// The number TEXT spells, whole: digits (for a real number also a point and an exponent), no sign
// but '-', no blanks, no hex, finite and within Number's range. Otherwise nullopt, and `past_range`
// says whether TEXT is a number beyond the type's range (too large, or for a double also too small).
template <typename Number>
std::optional<Number> whole_number(const std::string& text, bool* past_range = nullptr) {
  const char* first = text.data();
  const char* last = first + text.size();
  Number value{};
  std::from_chars_result read{};
  if constexpr (std::is_floating_point_v<Number>) read = std::from_chars(first, last, value, std::chars_format::general);
  else read = std::from_chars(first, last, value, 10);
  const bool whole = !text.empty() && read.ptr == last;
  if (past_range != nullptr) *past_range = whole && read.ec == std::errc::result_out_of_range;
  if (!whole || read.ec != std::errc()) return std::nullopt;
  if constexpr (std::is_floating_point_v<Number>)
    if (!std::isfinite(value)) return std::nullopt;  // inf, nan
  return value;
}

// TEXT as the value of FLAG, or a UserError naming the flag, the text as typed and the range.
template <typename Number>
Number read_number(const std::string& flag, const std::string& text, const NumberRange<Number>& range = {}) {
  bool past_range = false;
  const std::optional<Number> value = whole_number<Number>(text, &past_range);
  if (value && *value >= range.lowest && *value <= range.highest) return *value;
  std::string got = text.empty() ? "nothing" : text;
  if (past_range && range.words.empty()) {  // a flag's own words already say its range
    const bool negative = text.front() == '-';
    if constexpr (std::is_floating_point_v<Number>) {
      const bool tiny = std::strtod(text.c_str(), nullptr) == 0;  // strtod tells underflow from overflow
      got += tiny ? ", closer to 0 than the smallest double, " + format_number(std::numeric_limits<Number>::denorm_min()) +
                        ": write 0 for zero"
                  : negative ? ", below the lowest double, " + format_number(std::numeric_limits<Number>::lowest())
                             : ", above the largest double, " + format_number(std::numeric_limits<Number>::max());
    } else {
      got += negative ? ", below the smallest " + std::to_string(8 * sizeof(Number)) + "-bit integer, " +
                            std::to_string(std::numeric_limits<Number>::min())
                      : ", above the largest " + std::to_string(8 * sizeof(Number)) + "-bit integer, " +
                            std::to_string(std::numeric_limits<Number>::max());
    }
  }
  fail_user(kCommandLine, flag, "expected " + range_words(range) + " (got " + got + ")");
}

// The numeric flags, each bound to its field through read_number. check_every_number_is_ours walks
// the finished command line and refuses (a programming error) a numeric option made any other way,
// so a new flag cannot bypass the strict reading.
class NumberFlags {
 public:
  template <typename Number>
  CLI::Option* add(CLI::App& app, const std::string& flag, Number& field, const std::string& help,
                   NumberRange<Number> range = {}) {
    CLI::Option* option = app.add_option_function<std::string>(
        flag, [&field, flag, range](const std::string& text) { field = read_number(flag, text, range); }, help);
    option->type_name(std::is_floating_point_v<Number> ? "FLOAT" : std::is_unsigned_v<Number> ? "UINT" : "INT");
    option->default_function([&field] { return number_text(field); });
    ours_.insert(option);
    return option;
  }

  void check_every_number_is_ours(const CLI::App& app) const {
    for (const CLI::Option* option : app.get_options()) {
      const std::string type = option->get_type_name();
      if ((type == "INT" || type == "UINT" || type == "FLOAT" || type == "NUMBER") && ours_.count(option) == 0)
        throw std::logic_error("command line: " + option->get_name() +
                               " is a number read by CLI11 (clamps, wraps, octal); add it with NumberFlags::add");
    }
    for (const CLI::App* subcommand : app.get_subcommands([](const CLI::App*) { return true; }))
      check_every_number_is_ours(*subcommand);
  }

 private:
  std::set<const CLI::Option*> ours_;
};

// Flags given more than once with different values: the last one is used (TakeLast), and the user
// is told, since a repeated flag is as often a leftover as an override.
void collect_repeated_flags(const CLI::App& app, std::vector<std::string>& warnings) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_items_expected_max() > 1) continue;  // a list: every value counts
    const std::vector<std::string>& given = option->results();
    if (given.size() < 2 || std::all_of(given.begin(), given.end(),
                                        [&](const std::string& value) { return value == given.front(); }))
      continue;
    std::string values;
    for (const std::string& value : given) values += (values.empty() ? "" : ", ") + value;
    warnings.push_back(std::string(kCommandLine) + ": " + option->get_name() + " given " +
                       std::to_string(given.size()) + " times (" + values + "); using the last, " +
                       given.back());
  }
  for (const CLI::App* subcommand : app.get_subcommands()) collect_repeated_flags(*subcommand, warnings);
}

}  // namespace

Command parse_command_line(int argc, const char* const* argv) {
  Command command;
  RunConfig& run = command.run;
  PrepareOptions& prepare = command.prepare;

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

  // Training flags, named as GaLore's torchrun_main.py where it has one.
  std::vector<CLI::Option*> training_flags;
  auto add = [&](CLI::Option* option) {
    training_flags.push_back(option);
    return option;
  };
  // Flags of one optimizer: given with another, they would silently do nothing.
  std::vector<std::pair<CLI::Option*, std::string>> optimizer_flags;
  auto for_optimizer = [&](const std::string& owner, CLI::Option* option) {
    optimizer_flags.emplace_back(add(option), owner);
  };
  add(app.add_option("--config", run.config_path,
                     "model config: HF LlamaConfig JSON (required), e.g. configs/llama_60m.json"));
  // GaLore's and AdamW-SN's torchrun_main spellings (README "Command lines from GaLore and
  // AdamW-SN"): kept apart from ours so parse_command_line knows such a command line was given.
  std::string model_config;
  double beta1 = 0;
  int64_t max_train_tokens = 0;
  bool single_gpu = false, use_subset_norm_heuristics = false;
  std::vector<CLI::Option*> reference_flags = {
      add(app.add_option("--model_config", model_config, "GaLore's name for --config")),
      add(numbers.add(app, "--beta1", beta1, "AdamW-SN's name for --adam_beta1")),
      add(numbers.add(app, "--gradient_accumulation", run.data.gradient_accumulation_given,
                      "micro-batches per optimizer step: --total_batch_size = batch_size * ranks * N")),
      add(app.add_option_function<std::string>(
          "--max_train_tokens",
          [&max_train_tokens](const std::string& text) {
            // GaLore's spelling: an integer with an optional M (10^6) or B (10^9) suffix; the product
            // must fit the int64 count (10000000000B would wrap).
            const char suffix = text.empty() ? '\0' : text.back();
            const int64_t scale = suffix == 'M' ? 1'000'000 : suffix == 'B' ? 1'000'000'000 : 1;
            const std::optional<int64_t> count =
                whole_number<int64_t>(scale == 1 ? text : text.substr(0, text.size() - 1));
            if (!count || *count < 1 || __builtin_mul_overflow(*count, scale, &max_train_tokens))
              fail_user(kCommandLine, "--max_train_tokens",
                        "expected a number of tokens >= 1 and at most " +
                            std::to_string(std::numeric_limits<int64_t>::max()) + " (" +
                            std::to_string(std::numeric_limits<int64_t>::max() / 1'000'000'000) +
                            "B), digits with an optional M (10^6) or B (10^9) suffix, as 100M or 1B (got \"" + text +
                            "\")");
          },
          "tokens to train on (100M, 1B): sets --num_training_steps = ceil(tokens / (total_batch_size * "
          "max_length))")),
      add(app.add_flag("--single_gpu", single_gpu, "GaLore's flag: accepted, nothing to do (a world of one)")),
      add(app.add_flag("--use_subset_norm_heuristics", use_subset_norm_heuristics,
                       "AdamW-SN's name for --subset_size heuristics")),
      add(app.add_option("--name", run.logging.name, "run name, recorded in metrics.jsonl (GaLore's wandb name)")),
      add(app.add_option_function<std::string>(
          "--tags",
          [&run](const std::string& text) {
            run.logging.tags.clear();
            std::stringstream list(text);
            for (std::string tag; std::getline(list, tag, ',');) run.logging.tags.push_back(tag);
          },
          "comma-separated tags, recorded in metrics.jsonl (GaLore's wandb tags)")),
  };
  optimizer_flags.emplace_back(app.get_option("--use_subset_norm_heuristics"), "adamw_sn");
  add(numbers.add(app, "--lr", run.optimizer.lr, "peak learning rate")->capture_default_str());
  add(numbers.add(app, "--batch_size", run.data.batch_size, "micro-batch per rank, in sequences")
          ->capture_default_str());
  add(numbers.add(app, "--total_batch_size", run.data.total_batch_size,
                  "sequences per optimizer step; 0 = batch_size * world size (no accumulation)")
          ->capture_default_str());
  add(numbers.add(app, "--max_length", run.data.max_length, "tokens per sequence")->capture_default_str());
  add(numbers.add(app, "--num_training_steps", run.num_training_steps, "optimizer steps to run")
          ->capture_default_str());
  add(numbers.add(app, "--divergence_patience", run.divergence_patience,
                  "stop (exit 3) after this many steps with a zero gradient norm, or with the loss at or above "
                  "ln(vocab) + 1 after warmup; 0: never")
          ->capture_default_str());
  add(numbers.add(app, "--collective_timeout", run.collective_timeout,
                  "with several ranks: seconds a rank may make no progress (a collective that never "
                  "completes, a stopped or hung peer) before it ends the job (exit 4) naming the rank that "
                  "holds it up; 0: never")
          ->capture_default_str());
  add(numbers.add(app, "--preemption_grace_seconds", run.preemption_grace_seconds,
                  "seconds the cluster allows between its preemption signal and the kill: a rank whose step "
                  "and checkpoint have not finished by then ends itself (exit 128 + signal), saying so; 0: no "
                  "limit")
          ->capture_default_str());
  add(app.add_flag("--skip_memory_check", run.skip_memory_check,
                   "start even when the start-up memory check (this run's estimate against the GPU's free memory "
                   "and the node's available RAM) says it does not fit"));
  add(app.add_flag("--fuse_optimizer_with_backward", run.fuse_optimizer_with_backward,
                   "step each unit's optimizer as soon as its gradient shard is reduced, in backward, and free "
                   "the shard (needs --grad_clipping 0)"));
  bool activation_checkpointing = false;
  int64_t checkpoint_every = 0;
  CLI::Option* checkpointing_flag = add(app.add_flag(
      "--activation_checkpointing", activation_checkpointing,
      "recompute every transformer block's forward in backward, keeping only the block's input"));
  CLI::Option* checkpoint_every_flag = add(numbers.add(
      app, "--activation_checkpointing_every", checkpoint_every,
      "recompute every K-th block only (blocks 0, K, 2K, ...): less memory saved, less recompute"));
  int64_t warmup_steps = 0;  // run.optimizer.warmup_steps stays unset unless the flag is given
  CLI::Option* warmup_flag = add(
      numbers.add(app, "--warmup_steps", warmup_steps,
                  "linear warm-up steps of the schedule; default min(20, num_training_steps / 10)")
          ->default_str("min(20, num_training_steps / 10)"));
  EnumFlag<ShardingStrategy> sharding(
      {ShardingStrategy::full_shard, ShardingStrategy::shard_grad_op, ShardingStrategy::no_shard},
      run.sharding.strategy);
  add(sharding.add(app, "--sharding",
                   "full_shard (ZeRO-3), shard_grad_op (ZeRO-2) or no_shard (data parallel)"));
  bool no_prefetch = !run.sharding.prefetch;
  add(app.add_flag("--no_prefetch", no_prefetch,
                   "gather each unit only when it runs (default: the next unit's all-gather is "
                   "prefetched while one runs, on a CUDA side stream)"));
  EnumFlag<Offload> offload({Offload::none, Offload::optimizer}, run.sharding.offload);
  add(offload.add(app, "--offload",
                  "optimizer: fp32 master shards and optimizer state in host memory (pinned where "
                  "they cross to a GPU), stepped there per unit while the device goes on (docs/offload.md)"));
  EnumFlag<CommunicatorChoice> communicator(
      {CommunicatorChoice::auto_select, CommunicatorChoice::nccl, CommunicatorChoice::mpi}, run.sharding.communicator);
  add(communicator.add(app, "--communicator",
                       "what carries collectives across ranks: auto (NCCL on GPUs, MPI on CPUs), nccl, or mpi "
                       "(on GPUs: CUDA tensors staged through page-locked host memory, slow; lets several ranks "
                       "share one GPU, e.g. mpirun -np 4 on a one-GPU machine)"));
  EnumFlag<Scheduler> scheduler({Scheduler::cosine, Scheduler::linear, Scheduler::constant},
                                run.optimizer.scheduler);
  add(scheduler.add(app, "--scheduler", "learning-rate schedule after warm-up"));
  add(numbers.add(app, "--min_lr_ratio", run.optimizer.min_lr_ratio,
                  "final lr of cosine / linear decay, as a fraction of --lr")
          ->capture_default_str());
  add(numbers.add(app, "--weight_decay", run.optimizer.weight_decay, "decoupled weight decay")
          ->capture_default_str());
  add(numbers.add(app, "--grad_clipping", run.optimizer.grad_clipping, "max global grad norm; 0 = off")
          ->capture_default_str());
  add(numbers.add(app, "--adam_beta1", run.optimizer.adam_beta1, "Adam beta1")->capture_default_str());
  add(numbers.add(app, "--adam_beta2", run.optimizer.adam_beta2, "Adam beta2")->capture_default_str());
  add(numbers.add(app, "--adam_eps", run.optimizer.adam_eps,
                  "Adam epsilon; default 1e-8 for adamw, 1e-6 for adamw_sn and galore_adamw "
                  "(their references)"));
  EnumFlag<DType> dtype({DType::float32, DType::bfloat16}, run.precision.dtype);
  add(dtype.add(app, "--dtype", "compute dtype"));
  EnumFlag<Precision> precision({Precision::pure, Precision::mixed}, run.precision.mode);
  add(precision.add(app, "--precision",
                    "with bfloat16: pure bf16 weights (as GaLore) or mixed (fp32 master weights)"));
  add(app.add_option("--optimizer", run.optimizer.name,
                     "adamw (torch.optim.AdamW), adamw_sn (subset-norm) or galore_adamw (GaLore)")
          ->check(CLI::Validator(
              [](std::string& name) { return unknown_optimizer_reason(name); }, "", "known optimizer"))
          ->capture_default_str());
  for_optimizer("adamw_sn",
      app.add_option_function<std::string>(
             "--subset_size",
             [&run](const std::string& text) {
               if (text == "heuristics") {
                 run.optimizer.subset_size = 0;
                 return;
               }
               // -k is taken of a negative k (subset_size_for), so INT64_MIN is out.
               const std::optional<int64_t> value = whole_number<int64_t>(text);
               if (!value || *value == 0 || *value < -std::numeric_limits<int64_t>::max())
                 fail_user(kCommandLine, "--subset_size",
                           "expected heuristics or a non-zero integer from -" +
                               std::to_string(std::numeric_limits<int64_t>::max()) + " to " +
                               std::to_string(std::numeric_limits<int64_t>::max()) + " (got \"" + text + "\")");
               run.optimizer.subset_size = *value;
             },
             "adamw_sn: heuristics (one subset per row or column of a matrix) or k: contiguous "
             "subsets of the largest divisor of numel <= k (k > 0) or <= sqrt(numel)/|k| (k < 0)")
          ->default_str("heuristics"));
  for_optimizer("adamw_sn",
      app.add_option("--subset_norm_params", run.optimizer.subset_norm_params,
                     "adamw_sn: subset-norm on the linear weights only (the paper's best) or on all")
          ->check(CLI::IsMember({"linear", "all"}))
          ->capture_default_str());
  for_optimizer("galore_adamw",
      numbers.add(app, "--rank", run.optimizer.galore_rank, "galore_adamw: projection rank")->capture_default_str());
  for_optimizer("galore_adamw",
      numbers.add(app, "--update_proj_gap", run.optimizer.update_proj_gap,
                  "galore_adamw: steps between projector updates")
          ->capture_default_str());
  for_optimizer("galore_adamw",
      numbers.add(app, "--galore_scale", run.optimizer.galore_scale, "galore_adamw: scale of the projected update")
          ->capture_default_str());
  for_optimizer("galore_adamw",
      app.add_option("--proj_type", run.optimizer.proj_type, "galore_adamw: std, reverse_std, left or right")
          ->check(CLI::IsMember({"std", "reverse_std", "left", "right"}))
          ->capture_default_str());
  for_optimizer("galore_adamw",
      app.add_flag("--galore_stagger", run.optimizer.galore_stagger,
                   "galore_adamw: spread projector updates over the gap instead of all at once"));
  for_optimizer("galore_adamw",
      app.add_option("--galore_projector", run.optimizer.galore_projector,
                     "galore_adamw: svd (the reference's SVD of the gathered gradient) or subspace "
                     "(warm-started power iteration on the shards, no gathered gradient)")
          ->check(CLI::IsMember({"svd", "subspace"}))
          ->capture_default_str());
  for_optimizer("galore_adamw",
      numbers.add(app, "--subspace_iterations", run.optimizer.subspace_iterations,
                  "galore_adamw subspace: power iterations per refresh (3x at the first)")
          ->capture_default_str());
  add(numbers.add(app, "--seed", run.seed, "seed for initialisation and data order")
          ->capture_default_str());
  add(app.add_option("--data", run.data.source,
                     "\"synthetic\" or a token file made by `trainer prepare`")
          ->capture_default_str());
  add(numbers.add(app, "--eval_fraction", run.data.eval_fraction,
                  "share of the token windows held out for evaluation")
          ->capture_default_str());
  add(numbers.add(app, "--eval_every", run.data.eval_every, "evaluate every N steps; 0 = only at the end")
          ->capture_default_str());
  add(numbers.add(app, "--eval_batches", run.data.eval_batches, "batches per evaluation")
          ->capture_default_str());
  add(numbers.add(app, "--save_every", run.checkpoint.save_every,
                  "checkpoint every N steps; 0 = only at the end (with --save_dir)")
          ->capture_default_str());
  add(app.add_option("--save_dir", run.checkpoint.save_dir, "checkpoint folder; empty = no checkpoints")
          ->capture_default_str());
  add(numbers.add(app, "--keep_last", run.checkpoint.keep_last,
                  "after each save, keep this run's newest N step_<N> folders and remove older ones; 0 = all")
          ->capture_default_str());
  add(app.add_flag("--async_save", run.checkpoint.async_save,
                   "write each checkpoint on a background thread from a host copy of each rank's state while "
                   "training goes on; it completes at a later step boundary"));
  add(app.add_option("--continue_from", run.checkpoint.continue_from, "checkpoint folder to resume from")
          ->capture_default_str());
  add(app.add_option("--init_from", run.checkpoint.init_from,
                     "start a new run from a transformers save_pretrained folder's weights (safetensors), e.g. "
                     "one `trainer export` wrote"));
  add(app.add_option("--run_dir", run.logging.run_dir, "folder for logs and metrics (JSONL)")
          ->capture_default_str());
  EnumFlag<DeviceChoice> device(
      {DeviceChoice::auto_select, DeviceChoice::cpu, DeviceChoice::cuda}, run.device);
  add(device.add(app, "--device", "auto = this rank's GPU when there is one, else the CPU"));
  add(numbers.add(app, "--log_every", run.logging.log_every, "log a line every N steps")
          ->capture_default_str());
  add(app.add_flag("--print_config", run.logging.print_config,
                   "print the resolved model and run config as JSON and exit"));
  add(app.add_flag("--memory_snapshot", run.logging.memory_snapshot,
                   "CUDA only: record the allocator's history and write "
                   "RUN_DIR/memory_snapshot.rank<R>.pickle for pytorch.org/memory_viz"));
  add(app.add_option("--on_write_error", run.logging.on_write_error,
                     "a failed write of a run file (metrics.jsonl, memory ledger, memory_report.md; disk full, "
                     "quota): stop (exit 2 naming the file, after a last checkpoint when --save_dir is elsewhere) "
                     "or warn (once per file, and train on)")
          ->check(CLI::IsMember({"stop", "warn"}))
          ->capture_default_str());

  CLI::App* prepare_app = app.add_subcommand(
      "prepare", "Tokenise text files into a token file for --data (SentencePiece).");
  prepare_app->get_formatter()->column_width(34);
  prepare_app->add_option("--input", prepare.inputs,
                          "text file to tokenise (repeat for several files)")
      ->required();
  prepare_app->add_option("--output", prepare.output, "token file to write")->required();
  CLI::Option* tokenizer = prepare_app->add_option(
      "--tokenizer", prepare.tokenizer, "existing SentencePiece model to encode with");
  CLI::Option* vocab_size = numbers.add(
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

  CLI::App* report_app = app.add_subcommand(
      "report", "Aggregate the memory ledgers of run folders: Markdown tables and SVG plots side by side.");
  report_app->get_formatter()->column_width(34);
  report_app->add_option("run_dirs", command.report.run_dirs,
                         "run folders (--run_dir of a training run): metrics.jsonl and memory.rank<R>.jsonl")
      ->required();
  report_app->add_option("--out", command.report.out,
                         "folder for memory_report.md and memory/*.svg (with --techniques: techniques.md "
                         "and techniques/*.svg)")
      ->capture_default_str();
  report_app->add_flag("--techniques", command.report.techniques,
                       "the techniques table instead: the run folders are runs of one workload with different "
                       "memory techniques, the first of each world size the baseline of the shares");
  CLI::Option* context_sweep_flag =
      report_app->add_option("--context_sweep", command.report.context_sweep,
                             "with --techniques: runs of one workload at different context lengths (and dtypes): "
                             "the forward-only and training-step peaks over the context length");

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
  numbers.add(*estimate_app, "--world_size", command.estimate.world_size, "ranks to estimate for",
              NumberRange<int>{1, kMaxEstimateRanks,
                               ranks_range + ": the ranks to estimate for (the estimate simulates and lists each one)"})
      ->capture_default_str();
  numbers.add(*estimate_app, "--memory_budget_gib", command.estimate.memory_budget_gib,
              "memory per rank, GiB (e.g. 24): say whether each rank's peak fits",
              NumberRange<double>{smallest_gib, kMaxEstimateGib,
                                  gib_range + ": one rank's device memory (leave it out for no verdict)"});
  numbers.add(*estimate_app, "--ranks_per_node", command.estimate.ranks_per_node,
              "ranks sharing one node's host memory (consecutive ranks); default: all on one node",
              NumberRange<int>{1, kMaxEstimateRanks,
                               ranks_range + ": the ranks on one node (leave it out for every rank on one node)"});
  numbers.add(*estimate_app, "--node_memory_gib", command.estimate.node_memory_gib,
              "a node's RAM, GiB, for the host verdict; default: this machine's",
              NumberRange<double>{smallest_gib, kMaxEstimateGib,
                                  gib_range + ": one node's RAM (leave it out for this machine's)"});
  estimate_app->add_flag("--json", command.estimate.json, "print the estimate (every phase of every rank) as JSON");

  CLI::App* export_app = app.add_subcommand(
      "export", "Write a checkpoint as a transformers folder (config.json, model.safetensors, the tokenizer) that "
                "LlamaForCausalLM.from_pretrained loads: trainer export --from CHECKPOINT --to DIR.");
  export_app->get_formatter()->column_width(34);
  ExportOptions& exported = command.export_options;
  export_app->add_option("--from", exported.from, "a checkpoint folder, or a --save_dir (its newest intact step_<N>)")
      ->required();
  export_app->add_option("--to", exported.to, "the folder to write: new or empty (see --overwrite)")->required();
  export_app->add_option("--dtype", exported.dtype, "dtype of the exported tensors")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  std::string max_shard_size = "5GB";
  export_app->add_option("--max_shard_size", max_shard_size,
                         "largest safetensors file, as transformers: 5GB, 500MB, 2GiB or bytes; above it the "
                         "tensors go into model-0000K-of-0000N.safetensors and an index")
      ->capture_default_str();
  export_app->add_option("--tokenizer", exported.tokenizer,
                         "the SentencePiece model to export as tokenizer.model (default: the one `trainer prepare` "
                         "trained beside the run's token file, when there is one)");
  export_app->add_flag("--overwrite", exported.overwrite,
                       "write into a non-empty --to, replacing an earlier export's files (others are left alone)");

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
    const char* help = prepare_app->parsed()    ? "trainer prepare --help"
                       : report_app->parsed()   ? "trainer report --help"
                       : estimate_app->parsed() ? "trainer estimate --help"
                       : export_app->parsed()   ? "trainer export --help"
                                                : "trainer --help";
    fail_user(kCommandLine, "",
              std::string(error.what()) + " (run `" + help + "` for the flags and their values)");
  }

  collect_repeated_flags(app, command.warnings);
  // A verb other than training given a training flag: exit 2 naming the flag and what the verb takes.
  const auto refuse_training_flags = [&](const std::string& takes) {
    for (const CLI::Option* flag : training_flags)
      if (flag->count() > 0) fail_user(kCommandLine, flag->get_name(), "is a training flag; " + takes);
  };

  if (prepare_app->parsed()) {
    refuse_training_flags(
        "`trainer prepare` takes --input, --output, --tokenizer or --vocab_size, --model_type and --overwrite");
    if ((tokenizer->count() > 0) == (vocab_size->count() > 0))
      fail_user(kCommandLine, "--tokenizer / --vocab_size",
                "`trainer prepare` needs exactly one of the two: --tokenizer MODEL to encode with "
                "an existing SentencePiece model, or --vocab_size N to train a new one (got " +
                    std::string(tokenizer->count() > 0 ? "both" : "neither") + ")");
    command.kind = Command::Kind::prepare;
    return command;
  }

  if (report_app->parsed()) {
    refuse_training_flags(
        "`trainer report` takes run folders and --out (each run's settings come from its metrics.jsonl)");
    if (context_sweep_flag->count() > 0 && !command.report.techniques)
      fail_user(kCommandLine, "--context_sweep",
                "belongs to the techniques report: add --techniques (the run folders are then the technique runs)");
    command.kind = Command::Kind::report;
    return command;
  }

  if (export_app->parsed()) {
    refuse_training_flags(
        "`trainer export` takes --from, --to, --dtype, --max_shard_size, --tokenizer and --overwrite (the model "
        "comes from the checkpoint)");
    try {
      exported.max_shard_size = parse_byte_size(max_shard_size);  // 0: not a size, or outside [1, 2^64)
    } catch (const std::exception&) {  // std::stod of "." (as in ".GB")
      exported.max_shard_size = 0;
    }
    if (exported.max_shard_size == 0)
      fail_user(kCommandLine, "--max_shard_size",
                "expected a size of at least 1 byte and below 1.8e19 bytes (16 EiB): 5GB, 500MB, 2GiB or a number "
                "of bytes (got \"" + max_shard_size + "\")");
    command.kind = Command::Kind::export_model;
    return command;
  }

  // GaLore's and AdamW-SN's spellings mean ours; where their defaults differ from ours, the command
  // line keeps our meaning and the user is told (README "Command lines from GaLore and AdamW-SN").
  auto both_given = [&](const char* theirs, const char* ours) {
    fail_user(kCommandLine, std::string(theirs) + " / " + ours,
              std::string("the same setting given twice under two names, with different values; give one"));
  };
  if (app.count("--model_config") > 0) {
    if (app.count("--config") > 0 && run.config_path != model_config) both_given("--model_config", "--config");
    run.config_path = model_config;
  }
  if (app.count("--beta1") > 0) {
    if (app.count("--adam_beta1") > 0 && run.optimizer.adam_beta1 != beta1) both_given("--beta1", "--adam_beta1");
    run.optimizer.adam_beta1 = beta1;
  }
  if (use_subset_norm_heuristics) {
    if (app.count("--subset_size") > 0 && run.optimizer.subset_size != 0)
      both_given("--use_subset_norm_heuristics", "--subset_size");
    run.optimizer.subset_size = 0;
  }
  if (app.count("--gradient_accumulation") > 0 && run.data.gradient_accumulation_given < 1)
    fail_user(kCommandLine, "--gradient_accumulation",
              "expected an integer >= 1: micro-batches per optimizer step (got " +
                  std::to_string(run.data.gradient_accumulation_given) + ")");
  run.max_train_tokens = max_train_tokens;
  const bool reference_command_line = std::any_of(reference_flags.begin(), reference_flags.end(),
                                                  [](const CLI::Option* flag) { return flag->count() > 0; });
  auto warn = [&](const std::string& text) { command.warnings.push_back(std::string(kCommandLine) + ": " + text); };
  const char* theirs = "GaLore's and AdamW-SN's torchrun_main";
  if (single_gpu)
    warn("--single_gpu: accepted and ignored; the world here is the ranks mpirun starts, and one rank (no "
         "mpirun) is a single-GPU run with no flag");
  if (max_train_tokens > 0)
    warn("--max_train_tokens " + std::to_string(max_train_tokens) + ": --num_training_steps becomes ceil(tokens / "
         "(total_batch_size * max_length))" + (app.count("--num_training_steps") > 0 ? ", replacing the one given" : "") +
         "; GaLore's divides by total_batch_size only (sequences, not tokens), which gives max_length times "
         "more steps: pass --num_training_steps for its count");
  if (dtype.value() == DType::bfloat16 && app.count("--precision") == 0)
    warn("--dtype bfloat16 without --precision: mixed here (fp32 weights, bf16 autocast); GaLore's and "
         "AdamW-SN's --dtype bfloat16 is pure bf16 (the model cast to bf16): add --precision pure for bf16 "
         "weights (updated through fp32 master copies here)");
  if (app.count("--grad_clipping") == 0 && (reference_command_line || run.optimizer.name == "galore_adamw"))
    warn("--grad_clipping not given: the gradient norm is clipped to " + format_number(run.optimizer.grad_clipping) +
         " here; " + theirs + " default to 0 (no clipping): pass --grad_clipping 0 for theirs");
  if (reference_command_line) {
    // Defaults that differ from the references', for flags their command lines leave out.
    struct Default { const char* flag; std::string here, there; };
    const Default defaults[] = {
        {"--dtype", to_string(dtype.value()), "bfloat16 (pure) where the GPU supports it"},
        {"--max_length", std::to_string(run.data.max_length), "256"},
        {"--lr", format_number(run.optimizer.lr), "1e-4"},
        {"--num_training_steps", std::to_string(run.num_training_steps), "10000"},
        {"--warmup_steps", "min(20, num_training_steps / 10)", "1000"},
        {"--eval_every", std::to_string(run.data.eval_every), "5000"},
    };
    for (const Default& entry : defaults)
      if (app.count(entry.flag) == 0 && !(max_train_tokens > 0 && std::string(entry.flag) == "--num_training_steps"))
        warn(std::string(entry.flag) + " not given: " + entry.here + " here; " + theirs + " default to " +
             entry.there + ": pass " + entry.flag + " for theirs");
    if (run.optimizer.name == "adamw_sn" && app.count("--subset_size") == 0 && !use_subset_norm_heuristics)
      warn("--optimizer adamw_sn without --subset_size or --use_subset_norm_heuristics: heuristics here (one "
           "subset per row or column); AdamW-SN's torchrun_main defaults to --subset_size -2: pass "
           "--subset_size -2 for theirs");
    if (app.count("--beta1") > 0 && run.optimizer.name == "galore_adamw")
      warn("--beta1 is Adam's beta1 here (AdamW-SN's meaning); GaLore's torchrun_main passes it to Adafactor "
           "and SGD only, its galore_adamw keeps 0.9");
  }

  if (run.config_path.empty())
    fail_user(kCommandLine, "--config",
              std::string("required for ") + (estimate_app->parsed() ? "`trainer estimate`" : "training") +
                  ": pass a model config such as configs/llama_60m.json (or run `trainer --help`)");
  for (const auto& [flag, owner] : optimizer_flags)
    if (flag->count() > 0 && run.optimizer.name != owner)
      fail_user(kCommandLine, flag->get_name(),
                "applies to --optimizer " + owner + " only (got --optimizer " + run.optimizer.name + ")");
  if (warmup_flag->count() > 0) run.optimizer.warmup_steps = warmup_steps;
  if (checkpoint_every_flag->count() > 0) {
    if (checkpoint_every < 1)
      fail_user(kCommandLine, "--activation_checkpointing_every",
                "expected a number of blocks >= 1 (got " + std::to_string(checkpoint_every) +
                    "); leave it out for no activation checkpointing");
    // Both given and disagreeing: refused rather than one silently winning.
    if (activation_checkpointing && checkpoint_every != 1) {
      const std::string k = std::to_string(checkpoint_every);
      fail_user(kCommandLine, "--activation_checkpointing / --activation_checkpointing_every",
                "give one: --activation_checkpointing recomputes every transformer block in backward (as "
                "--activation_checkpointing_every 1); --activation_checkpointing_every " + k +
                    " recomputes one block in " + k + " (blocks 0, " + k + ", 2 x " + k +
                    ", ...), saving less memory for less recompute");
    }
    run.activation_checkpointing_every = checkpoint_every;
  } else if (checkpointing_flag->count() > 0 && activation_checkpointing)
    run.activation_checkpointing_every = 1;
  run.optimizer.scheduler = scheduler.value();
  run.sharding.strategy = sharding.value();
  run.sharding.prefetch = !no_prefetch;
  run.sharding.offload = offload.value();
  run.sharding.communicator = communicator.value();
  run.precision.dtype = dtype.value();
  run.precision.mode = precision.value();
  run.device = device.value();
  command.kind = estimate_app->parsed() ? Command::Kind::estimate : Command::Kind::train;
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
