#include "trainer/train_loop.h"

#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <sstream>

#include "common/errors.h"
#include "common/log.h"
#include "common/memory_stats.h"
#include "trainer/autocast.h"
#include "trainer/checkpoint.h"
#include "trainer/data/batches.h"
#include "trainer/data/synthetic.h"
#include "trainer/memory/ledger.h"
#include "trainer/metrics.h"
#include "trainer/model/llama.h"
#include "trainer/model/units.h"
#include "trainer/optimizer_setup.h"
#include "sharding/fsdp_unit.h"
#include "sharding/gather_schedule.h"
#include "trainer/schedule.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kSyntheticCorpusSeed = 1234;  // the corpus is fixed; --seed varies init and order

struct Corpus {
  std::shared_ptr<TokenFile> tokens;
  double unigram_entropy = 0;
  double entropy_rate = 0;
};

Corpus open_corpus(const RunConfig& run, const ModelConfig& model, const RuntimeContext& context) {
  if (run.data != "synthetic") return {TokenFile::open(run.data, model.vocab_size)};
  SyntheticCorpusSpec spec;
  spec.vocab_size = model.vocab_size;
  spec.seed = kSyntheticCorpusSeed;
  SyntheticCorpus corpus = generate_synthetic_corpus(spec);
  // Every rank generates the same corpus; each writes its own copy, so no rank waits on a file.
  const std::string path =
      (fs::path(run.run_dir) / ("synthetic.rank" + std::to_string(context.rank) + ".tok")).string();
  write_token_file(path, corpus.tokens, model.vocab_size);
  log::info("synthetic corpus: {} tokens, unigram entropy {:.3f} nats, entropy floor {:.3f} nats",
            corpus.tokens.size(), corpus.unigram_entropy_nats, corpus.entropy_rate_nats);
  return {TokenFile::open(path, model.vocab_size), corpus.unigram_entropy_nats,
          corpus.entropy_rate_nats};
}

// Global L2 norm over every rank's gradient shard; scales the shards to max_norm when above it
// (torch's clip_grad_norm_ rule). no_shard ranks each hold the whole gradient: no reduction then.
double clip_gradients(std::vector<std::unique_ptr<ShardedUnit>>& units, Communicator& communicator,
                      ShardingStrategy strategy, double max_norm) {
  at::Tensor squares = at::zeros({1}, units.front()->shard_grad().options());
  for (auto& unit : units) squares += unit->shard_grad().pow(2).sum();
  if (strategy != ShardingStrategy::no_shard) communicator.all_reduce(squares, ReduceOp::sum);
  const double norm = std::sqrt(squares.item<double>());
  if (max_norm > 0 && std::isfinite(norm)) {
    const double coefficient = max_norm / (norm + 1e-6);
    if (coefficient < 1.0)
      for (auto& unit : units) unit->shard_grad().mul_(coefficient);
  }
  return norm;
}

// Every rank's persistent training state, counted from the buffers that exist (after a step, when
// the optimizer state is allocated): one "sharded_state" record with a row per rank.
void record_sharded_bytes(MetricsLog& metrics, std::vector<std::unique_ptr<ShardedUnit>>& units,
                          const ShardOptimizer& optimizer, Communicator& communicator) {
  const int world = communicator.world_size(), rank = communicator.rank();
  int64_t parameters = 0, gradients = 0, materialized = 0;
  for (auto& unit : units) {
    parameters += unit->shard().numel() * unit->shard().element_size();
    gradients += unit->shard_grad().numel() * unit->shard_grad().element_size();
    materialized += unit->compute_parameter_bytes();
  }
  at::Tensor table = at::zeros({world, 4}, at::TensorOptions().dtype(at::kLong).device(communicator.device()));
  table[rank] = at::tensor({parameters, gradients, optimizer.state_bytes(), materialized}, at::kLong)
                    .to(communicator.device());
  if (world > 1) communicator.all_reduce(table, ReduceOp::sum);
  table = table.to(at::kCPU);
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r)
    ranks.push_back({{"rank", r}, {"parameter_shard_bytes", table[r][0].item<int64_t>()},
                     {"gradient_shard_bytes", table[r][1].item<int64_t>()},
                     {"optimizer_state_bytes", table[r][2].item<int64_t>()},
                     {"materialized_parameter_bytes", table[r][3].item<int64_t>()}});
  metrics.write({{"event", "sharded_state"}, {"ranks", ranks}});
}

double average_over_ranks(double value, Communicator& communicator) {
  at::Tensor tensor = at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(communicator.device()));
  if (communicator.world_size() > 1) {
    tensor = tensor.to(at::kFloat);
    communicator.all_reduce(tensor, ReduceOp::average);
  }
  return tensor.item<double>();
}

// Puts a checkpoint's full model tensors (any world size) into this rank's shards. The optimizer
// loads its own full tensors (ShardOptimizer::load_full_state_dict).
void restore_shards(const Checkpoint& checkpoint, const std::string& folder,
                    std::vector<std::unique_ptr<ShardedUnit>>& units, c10::Device device) {
  for (auto& unit : units) {
    std::vector<at::Tensor> tensors;
    for (const auto& parameter : unit->layout().parameters) {
      auto found = checkpoint.model.find(parameter.name);
      LLM_REQUIRE(found != checkpoint.model.end(), folder + "/model.pt", parameter.name, "missing tensor");
      LLM_REQUIRE(found->second.sizes() == at::IntArrayRef(parameter.full_shape), folder + "/model.pt",
                  parameter.name, "shape does not match the model");
      tensors.push_back(found->second.to(device, at::kFloat));
    }
    unit->load_full(tensors, unit->shard());
    unit->publish_shard();
  }
}

// The sharded model: units of the single-device model wrapped by ShardedUnit, run unit by unit.
// When each unit is gathered, prefetched and released is the GatherSchedule's decision; this struct
// carries the actions out (apply) and measures how many units are gathered at once.
struct ShardedModel {
  LlamaForCausalLM model;
  UnitContext context;
  std::vector<ModelUnit> units;
  std::vector<std::unique_ptr<ShardedUnit>> sharded;
  GatherSchedule schedule;
  CollectiveStream gather_stream;       // CUDA side stream for prefetches; none on CPU
  int64_t peak_gathered_units = 0;      // counted from the units themselves, after every action
  // Called after each unit's forward ("forward", or "eval" without grad; its compute copy still
  // gathered) and after its backward ("backward"; before its gradients are reduced): the memory
  // ledger's timeline points.
  std::function<void(const char* phase, size_t unit)> on_unit_boundary = nullptr;

  // Forward through every unit; returns each unit's (input, output). Unit inputs after the first are
  // detached leaves, so each unit's backward runs on its own, between its gather and its release.
  std::vector<std::pair<at::Tensor, at::Tensor>> forward(const at::Tensor& input_ids, bool autocast) {
    std::vector<std::pair<at::Tensor, at::Tensor>> boundaries;
    AutocastRegion region(input_ids.device().type(), at::kBFloat16, autocast);
    at::Tensor x = input_ids;
    for (size_t u = 0; u < units.size(); ++u) {
      apply(schedule.before_forward(static_cast<int64_t>(u)));  // gather u, prefetch u + 1
      at::Tensor input = (u == 0 || !at::GradMode::is_enabled()) ? x : x.detach().requires_grad_(true);
      at::Tensor output = units[u].forward(input);
      if (on_unit_boundary) on_unit_boundary(at::GradMode::is_enabled() ? "forward" : "eval", u);
      apply(schedule.after_forward(static_cast<int64_t>(u)));   // full_shard: release u
      boundaries.emplace_back(input, output);
      x = output;
    }
    return boundaries;
  }

  // Backward unit by unit in reverse: gather (prefetch the one before), backward, (last micro-batch)
  // reduce gradients, release.
  void backward(std::vector<std::pair<at::Tensor, at::Tensor>>& boundaries, const at::Tensor& loss,
                bool reduce) {
    at::Tensor grad_output;
    for (size_t u = units.size(); u-- > 0;) {
      apply(schedule.before_backward(static_cast<int64_t>(u)));  // gather u, prefetch u - 1
      if (u + 1 == units.size())
        loss.backward();
      else
        boundaries[u].second.backward(grad_output);
      if (u > 0) grad_output = boundaries[u].first.grad();
      boundaries[u] = {};
      if (on_unit_boundary) on_unit_boundary("backward", u);
      if (reduce) sharded[u]->reduce_gradients();
      apply(schedule.after_backward(static_cast<int64_t>(u)));   // release u
    }
  }

  void release_all() { apply(schedule.release_all()); }

  void apply(const std::vector<GatherAction>& actions) {
    for (const GatherAction& action : actions) {
      ShardedUnit& unit = *sharded[static_cast<size_t>(action.unit)];
      switch (action.op) {
        case GatherOp::gather: unit.gather(); break;
        case GatherOp::prefetch: unit.gather_async(gather_stream); break;
        case GatherOp::wait: unit.wait_gathered(); break;
        case GatherOp::release: unit.release(); break;
      }
      // The schedule's bookkeeping must describe the units, or its bound would mean nothing.
      if (unit.gathered() != schedule.materialised(action.unit))
        throw std::logic_error("gather schedule: after " + std::string(to_string(action.op)) +
                               " of unit " + unit.name() + " the unit is " +
                               (unit.gathered() ? "gathered" : "released") +
                               " but the schedule thinks otherwise");
      count_gathered_units();
    }
  }

  // Updates the measured peak; also called once before the first step (no_shard units are
  // materialised from the start, and no action ever changes that).
  void count_gathered_units() {
    int64_t gathered_now = 0;
    for (const auto& each : sharded) gathered_now += each->gathered() ? 1 : 0;
    peak_gathered_units = std::max(peak_gathered_units, gathered_now);
  }
};

// The end-of-run record of the gather order: tests read the peak from it.
nlohmann::json gather_schedule_record(const ShardedModel& model) {
  return {{"event", "gather_schedule"},
          {"strategy", to_string(model.schedule.strategy())},
          {"prefetch", model.schedule.prefetch()},
          {"side_stream", model.gather_stream.has_value()},
          {"units", model.schedule.unit_count()},
          {"peak_gathered_units", model.peak_gathered_units},
          {"schedule_peak_gathered_units", model.schedule.peak_gathered_units()},
          {"inline_gathers", model.schedule.inline_gathers()},
          {"prefetches", model.schedule.prefetches()}};
}

Batch to_device(Batch batch, c10::Device device) {
  return {batch.input_ids.to(device), batch.labels.to(device)};
}

double evaluate(ShardedModel& sharded_model, BatchSampler& sampler, const RunConfig& run,
                Communicator& communicator, bool autocast, int64_t* tokens) {
  at::NoGradGuard no_grad;
  sampler.seek(0);
  double sum = 0;
  for (int64_t i = 0; i < run.eval_batches; ++i) {
    Batch batch = to_device(sampler.next(), communicator.device());
    auto boundaries = sharded_model.forward(batch.input_ids, autocast);
    sum += causal_lm_loss(boundaries.back().second, batch.labels).item<double>();
    *tokens += batch.labels.numel() * communicator.world_size();
  }
  sharded_model.release_all();
  return average_over_ranks(sum / static_cast<double>(run.eval_batches), communicator);
}

// The end of the run's ledger (collective): rank 0 writes RUN_DIR/memory_report.md, and every rank's
// summary goes into metrics.jsonl as one "memory" record.
void finish_memory_ledger(MemoryLedger& ledger, MetricsLog& metrics, Communicator& communicator,
                          const ModelConfig& model_config, const RunConfig& run, int world_size,
                          c10::Device device, int64_t steps) {
  std::ostringstream description;
  description << "Run `" << run.run_dir << "`: " << model_config.name << ", " << run.optimizer << ", "
              << to_string(run.dtype)
              << (run.dtype == DType::bfloat16 ? std::string(" (") + to_string(run.precision) + ")" : "")
              << ", " << to_string(run.sharding) << ", " << world_size << " rank(s) on " << device.str()
              << ", batch " << run.batch_size << " x " << run.max_length << " tokens, " << steps
              << " step(s).";
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankMemorySummary& rank : ledger.finish(communicator, "Memory report", description.str()))
    ranks.push_back(rank.to_json());
  metrics.write({{"event", "memory"}, {"ranks", ranks}});
}

}  // namespace

c10::Device select_device(DeviceChoice choice, int local_rank) {
  const bool have_cuda = torch::cuda::is_available();
  if (choice == DeviceChoice::cuda) {
    LLM_REQUIRE(have_cuda, "--device", "cuda", "no CUDA device is visible; use --device cpu or auto");
    const int count = static_cast<int>(torch::cuda::device_count());
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
  }
  if (choice == DeviceChoice::auto_select && have_cuda)
    return select_device(DeviceChoice::cuda, local_rank);
  return c10::Device(c10::kCPU);
}

TrainingOutcome train(const ModelConfig& model_config, const RunConfig& run,
                      const RuntimeContext& context) {
  const bool is_writer = context.rank == 0;
  const c10::Device device = context.device;
  Communicator& communicator = *context.communicator;
  // --memory_snapshot on a CPU rank is a UserError here, before anything is written.
  constexpr int64_t kSnapshotSteps = 2;  // --memory_snapshot: history through these steps
  if (run.memory_snapshot) start_device_memory_history(device, 100000);
  fs::create_directories(run.run_dir);
  MetricsLog metrics((fs::path(run.run_dir) / "metrics.jsonl").string(), is_writer,
                     context.world_size == 1);
  // Before anything is built: the window up to the first step is the start-up peak.
  MemoryLedger ledger(run.run_dir, context.rank, context.world_size, device,
                      {{"model", model_config.name}, {"optimizer", run.optimizer},
                       {"dtype", to_string(run.dtype)}, {"precision", to_string(run.precision)},
                       {"sharding", to_string(run.sharding)}});

  Corpus corpus = open_corpus(run, model_config, context);
  BatchSampler train_batches(corpus.tokens, Split::train, run.max_length, run.eval_fraction,
                             run.seed, context.rank, context.world_size, run.batch_size);
  BatchSampler eval_batches(corpus.tokens, Split::eval, run.max_length, run.eval_fraction, run.seed,
                            context.rank, context.world_size, run.batch_size);

  // Every rank builds the same initial weights; each unit then keeps only this rank's rows.
  const bool bf16 = run.dtype == DType::bfloat16;
  const bool pure_bf16 = bf16 && run.precision == Precision::pure;
  const bool autocast = bf16 && !pure_bf16;
  // Each unit is initialised, moved to the device and sharded as soon as it is built, before the
  // next one is allocated: no rank ever holds the whole unsharded model (no_shard aside, by design).
  at::manual_seed(run.seed);
  std::vector<std::unique_ptr<ShardedUnit>> built_units;
  int64_t startup_peak_bytes = 0, largest_unit_bytes = 0;
  auto shard_unit_when_built = [&](const std::string& name, int64_t index, NamedTensors parameters) {
    int64_t unit_bytes = 0;
    {
      at::NoGradGuard no_grad;
      for (auto& [parameter_name, parameter] : parameters) {
        parameter.set_data(parameter.to(device));
        unit_bytes += static_cast<int64_t>(parameter.storage().nbytes());
      }
    }
    init_unit_weights(parameters, model_config, run.seed, index);
    int64_t held = unit_bytes;
    for (auto& unit : built_units) held += unit->compute_parameter_bytes();
    startup_peak_bytes = std::max(startup_peak_bytes, held);
    largest_unit_bytes = std::max(largest_unit_bytes, unit_bytes);
    built_units.push_back(std::make_unique<ShardedUnit>(name, std::move(parameters), communicator,
                                                        run.sharding,
                                                        pure_bf16 ? at::kBFloat16 : at::kFloat));
  };
  ShardedModel sharded_model{LlamaForCausalLM(model_config, shard_unit_when_built), {}, {},
                             std::move(built_units), {}, {}, 0};
  sharded_model.units = split_into_units(sharded_model.model, sharded_model.context);
  auto& units = sharded_model.sharded;
  sharded_model.schedule = GatherSchedule(static_cast<int64_t>(units.size()), run.sharding, run.prefetch);
  if (run.prefetch) sharded_model.gather_stream = make_gather_stream(device);
  sharded_model.count_gathered_units();
  const bool sharded_across_ranks = context.world_size > 1 && run.sharding != ShardingStrategy::no_shard;
  std::unique_ptr<ShardOptimizer> optimizer =
      build_optimizer(run, units, sharded_across_ranks ? &communicator : nullptr);

  int64_t start_step = 0, tokens_seen = 0;
  if (!run.continue_from.empty()) {
    const std::string folder = resolve_checkpoint_folder(run.continue_from);
    Checkpoint checkpoint = load_checkpoint(folder);
    LLM_REQUIRE(checkpoint.trainer_state.value("model", nlohmann::json()) == model_config.to_json(),
                folder, "trainer_state.json: model", "the checkpoint was made for another model config");
    auto state_count = [&](const char* key) {
      const nlohmann::json& state = checkpoint.trainer_state;
      LLM_REQUIRE(state.contains(key) && state.at(key).is_number_integer(),
                  folder + "/trainer_state.json", key, "missing, or not an integer");
      return state.at(key).get<int64_t>();
    };
    start_step = state_count("step");
    tokens_seen = state_count("tokens_seen");
    const int64_t samples_consumed = state_count("samples_consumed");
    const std::string saved_optimizer = checkpoint.trainer_state.value("optimizer", std::string("adamw"));
    LLM_REQUIRE(saved_optimizer == run.optimizer, folder + "/trainer_state.json", "optimizer",
                "the checkpoint was written by --optimizer " + saved_optimizer + "; resume with it (got --optimizer " +
                    run.optimizer + ")");
    restore_shards(checkpoint, folder, units, device);
    optimizer->load_full_state_dict(checkpoint.optimizer);
    train_batches.seek(samples_consumed);
    log::info("resumed from {} at step {}", folder, start_step);
  }

  int64_t shard_bytes = 0;
  for (auto& unit : units) shard_bytes += unit->shard().numel() * 4;
  metrics.write({{"event", "start"}, {"model", model_config.to_json()}, {"run", run.to_json()},
                 {"world_size", context.world_size}, {"device", device.str()},
                 {"communicator", communicator.backend_name()},
                 {"sharding", to_string(run.sharding)},
                 {"parameters", model_config.num_parameters()},
                 {"shard_parameter_bytes", shard_bytes},
                 {"optimizer", run.optimizer},
                 {"optimizer_state_bytes", optimizer->state_bytes()},
                 {"startup_peak_parameter_bytes", startup_peak_bytes},
                 {"largest_unit_parameter_bytes", largest_unit_bytes},
                 {"corpus_unigram_entropy", corpus.unigram_entropy},
                 {"corpus_entropy_rate", corpus.entropy_rate}, {"start_step", start_step}});
  log::info("model {}: {:.2f}M parameters on {} x {} ({}, {}), {} steps of {} sequences x {} tokens",
            model_config.name, model_config.num_parameters() / 1e6, context.world_size, device.str(),
            communicator.backend_name(), to_string(run.sharding), run.num_training_steps,
            run.total_batch_size, run.max_length);
  log::info("optimizer {}: {} of state on this rank", run.optimizer, human_bytes(optimizer->state_bytes()));

  // Checkpoints hold full tensors (world-size independent): every rank joins the gathers, rank 0 writes.
  auto save = [&](int64_t step) {
    if (run.save_dir.empty()) return;
    std::vector<std::pair<std::string, at::Tensor>> model_tensors;
    for (auto& unit : units)
      for (auto& named : unit->gather_full(unit->shard())) model_tensors.push_back(std::move(named));
    const std::map<std::string, at::Tensor> optimizer_state = optimizer->full_state_dict();
    if (!is_writer) return;
    const std::string folder = (fs::path(run.save_dir) / ("step_" + std::to_string(step))).string();
    save_checkpoint(folder, model_tensors, optimizer_state,
                    {{"step", step}, {"samples_consumed", train_batches.samples_consumed()},
                     {"tokens_seen", tokens_seen}, {"seed", run.seed}, {"world_size", context.world_size},
                     {"optimizer", run.optimizer},
                     {"model", model_config.to_json()}});
    log::info("saved checkpoint {}", folder);
  };

  // The ledger's owned buffers: everything the trainer holds, by category (trainer/memory/ledger.h).
  int64_t live_batch_bytes = 0;
  auto owned_now = [&] {
    const int64_t rotary = distinct_storage_bytes(
        {sharded_model.model->rotary_cos_cache(), sharded_model.model->rotary_sin_cache(),
         sharded_model.context.cos, sharded_model.context.sin});
    return owned_memory(units, *optimizer, live_batch_bytes + rotary);
  };
  sharded_model.on_unit_boundary = [&](const char* phase, size_t u) {
    ledger.point(phase, sharded_model.units[u].name, owned_now());
  };

  TrainingOutcome outcome{start_step, 0, 0, corpus.unigram_entropy, corpus.entropy_rate};
  const int64_t tokens_per_step = run.total_batch_size * run.max_length;
  for (int64_t step = start_step + 1; step <= run.num_training_steps; ++step) {
    const auto started = std::chrono::steady_clock::now();
    ledger.begin_step(step);
    double loss_sum = 0;
    for (int64_t micro = 0; micro < run.gradient_accumulation; ++micro) {
      Batch batch = to_device(train_batches.next(), device);
      ledger.set_micro_batch(micro);
      live_batch_bytes = static_cast<int64_t>(batch.input_ids.nbytes() + batch.labels.nbytes());
      auto boundaries = sharded_model.forward(batch.input_ids, autocast);
      at::Tensor loss = causal_lm_loss(boundaries.back().second, batch.labels);
      loss_sum += loss.item<double>();
      // Gradients are reduced once per optimizer step, after the last micro-batch.
      sharded_model.backward(boundaries, loss / static_cast<double>(run.gradient_accumulation),
                             micro + 1 == run.gradient_accumulation);
    }
    live_batch_bytes = 0;
    const double loss =
        average_over_ranks(loss_sum / static_cast<double>(run.gradient_accumulation), communicator);
    const double grad_norm = clip_gradients(units, communicator, run.sharding, run.grad_clipping);
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      std::ostringstream message;
      message << "step " << step << ": the loss is " << loss << " and the gradient norm "
              << grad_norm << "; training stopped before the weights were corrupted. Lower --lr"
              << " (now " << run.lr << "), set --grad_clipping (now " << run.grad_clipping
              << "), raise --warmup_steps, or use --dtype float32";
      throw TrainingError(message.str());
    }
    const double lr = run.lr * lr_multiplier(run.scheduler, step, run.warmup_steps,
                                             run.num_training_steps, run.min_lr_ratio);
    optimizer->step(lr);
    for (auto& unit : units) unit->publish_shard();
    ledger.point("optimizer", "", owned_now());
    tokens_seen += tokens_per_step;
    if (step == start_step + 1) record_sharded_bytes(metrics, units, *optimizer, communicator);

    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    outcome.steps = step;
    outcome.final_loss = loss;
    if (step % run.log_every == 0 || step == run.num_training_steps)
      metrics.log_step({step, run.num_training_steps, loss, lr, grad_norm,
                        static_cast<double>(tokens_per_step) / seconds, seconds, tokens_seen,
                        ledger.step_line_peak_bytes(), optimizer->last_projector_seconds()});
    const bool last = step == run.num_training_steps;
    if ((run.eval_every > 0 && step % run.eval_every == 0) || last) {
      int64_t eval_tokens = 0;
      outcome.final_eval_loss =
          evaluate(sharded_model, eval_batches, run, communicator, autocast, &eval_tokens);
      ledger.point("eval", "", owned_now());
      metrics.log_eval(step, outcome.final_eval_loss, eval_tokens);
    }
    if ((run.save_every > 0 && step % run.save_every == 0) || last) {
      save(step);
      if (!run.save_dir.empty()) ledger.point("checkpoint", "", owned_now());
    }
    ledger.end_step();
    // Once: after the second step (or the last, if fewer). Recording stops there, so a later
    // snapshot would replace this one with one whose history is gone.
    if (run.memory_snapshot && step == std::min(start_step + kSnapshotSteps, run.num_training_steps)) {
      write_device_memory_snapshot(
          device, (fs::path(run.run_dir) / ("memory_snapshot.rank" + std::to_string(context.rank) + ".pickle")).string());
      stop_device_memory_history(device);
    }
  }
  finish_memory_ledger(ledger, metrics, communicator, model_config, run, context.world_size, device,
                       outcome.steps - start_step);
  metrics.write(gather_schedule_record(sharded_model));
  metrics.write({{"event", "end"}, {"steps", outcome.steps}, {"final_loss", outcome.final_loss},
                 {"final_eval_loss", outcome.final_eval_loss},
                 {"peak_memory_bytes", ledger.step_line_peak_bytes()}});
  return outcome;
}

}  // namespace llm
