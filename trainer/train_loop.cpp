#include "trainer/train_loop.h"

#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "common/errors.h"
#include "common/log.h"
#include "common/memory_stats.h"
#include "optim/adamw.h"
#include "trainer/autocast.h"
#include "trainer/checkpoint.h"
#include "trainer/data/batches.h"
#include "trainer/data/synthetic.h"
#include "trainer/metrics.h"
#include "trainer/model/llama.h"
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

Corpus open_corpus(const RunConfig& run, const ModelConfig& model) {
  if (run.data != "synthetic") return {TokenFile::open(run.data, model.vocab_size)};
  SyntheticCorpusSpec spec;
  spec.vocab_size = model.vocab_size;
  spec.seed = kSyntheticCorpusSeed;
  SyntheticCorpus corpus = generate_synthetic_corpus(spec);
  const std::string path = (fs::path(run.run_dir) / "synthetic.tok").string();
  write_token_file(path, corpus.tokens, model.vocab_size);
  log::info("synthetic corpus: {} tokens, unigram entropy {:.3f} nats, entropy floor {:.3f} nats",
            corpus.tokens.size(), corpus.unigram_entropy_nats, corpus.entropy_rate_nats);
  return {TokenFile::open(path, model.vocab_size), corpus.unigram_entropy_nats,
          corpus.entropy_rate_nats};
}

// The weights the optimizer updates. fp32 and mixed: the model's own parameters. Pure bf16: fp32
// copies whose gradients are the bf16 gradients upcast, copied back into the model after each step.
struct MasterWeights {
  std::vector<std::pair<std::string, at::Tensor>> model_params;
  std::vector<at::Tensor> masters;
  bool separate = false;

  void gather_gradients() {
    if (!separate) return;
    for (size_t i = 0; i < masters.size(); ++i) {
      const at::Tensor& grad = model_params[i].second.grad();
      masters[i].mutable_grad() = grad.defined() ? grad.to(at::kFloat) : at::Tensor();
    }
  }
  void publish() {
    if (!separate) return;
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < masters.size(); ++i) model_params[i].second.copy_(masters[i]);
  }
  void zero_gradients() {
    for (auto& [name, param] : model_params) param.mutable_grad() = at::Tensor();
    if (separate)
      for (auto& master : masters) master.mutable_grad() = at::Tensor();
  }
  std::vector<std::pair<std::string, at::Tensor>> named_masters() const {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (size_t i = 0; i < masters.size(); ++i) named.emplace_back(model_params[i].first, masters[i]);
    return named;
  }
};

// Global L2 norm of all gradients; scales them to max_norm when above it (torch's clip_grad_norm_).
double clip_gradients(const std::vector<at::Tensor>& params, double max_norm) {
  at::Tensor total = at::zeros({}, params.front().options().dtype(at::kFloat));
  for (const auto& p : params)
    if (p.grad().defined()) total += p.grad().to(at::kFloat).pow(2).sum();
  const double norm = std::sqrt(total.item<double>());
  if (max_norm > 0 && std::isfinite(norm)) {
    const double coefficient = max_norm / (norm + 1e-6);
    if (coefficient < 1.0)
      for (const auto& p : params)
        if (p.grad().defined()) p.grad().mul_(coefficient);
  }
  return norm;
}

Batch to_device(Batch batch, c10::Device device) {
  return {batch.input_ids.to(device), batch.labels.to(device)};
}

double evaluate(LlamaForCausalLM& model, BatchSampler& sampler, const RunConfig& run,
                c10::Device device, bool autocast, int64_t* tokens) {
  at::NoGradGuard no_grad;
  model->eval();
  sampler.seek(0);
  double sum = 0;
  for (int64_t i = 0; i < run.eval_batches; ++i) {
    Batch batch = to_device(sampler.next(), device);
    AutocastRegion region(device.type(), at::kBFloat16, autocast);
    sum += causal_lm_loss(model->forward(batch.input_ids), batch.labels).item<double>();
    *tokens += batch.labels.numel();
  }
  model->train();
  return sum / static_cast<double>(run.eval_batches);
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
  fs::create_directories(run.run_dir);
  MetricsLog metrics((fs::path(run.run_dir) / "metrics.jsonl").string(), is_writer);

  Corpus corpus = open_corpus(run, model_config);
  BatchSampler train_batches(corpus.tokens, Split::train, run.max_length, run.eval_fraction,
                             run.seed, context.rank, context.world_size, run.batch_size);
  BatchSampler eval_batches(corpus.tokens, Split::eval, run.max_length, run.eval_fraction, run.seed,
                            context.rank, context.world_size, run.batch_size);

  at::manual_seed(run.seed);
  LlamaForCausalLM model(model_config);
  model->init_weights(run.seed);
  model->to(device);
  const bool bf16 = run.dtype == DType::bfloat16;
  const bool pure_bf16 = bf16 && run.precision == Precision::pure;
  const bool autocast = bf16 && !pure_bf16;

  MasterWeights weights{named_parameters_in_order(*model), {}, pure_bf16};
  for (auto& [name, param] : weights.model_params)
    weights.masters.push_back(pure_bf16 ? param.detach().clone() : param);
  if (pure_bf16) model->to(at::kBFloat16);
  weights.model_params = named_parameters_in_order(*model);

  std::vector<OptimizedTensor> optimized;
  for (size_t i = 0; i < weights.masters.size(); ++i)
    optimized.push_back({weights.model_params[i].first, weights.masters[i], weights.masters[i].dim() >= 2});
  AdamW optimizer(optimized, AdamWOptions{run.adam_beta1, run.adam_beta2, run.adam_eps, run.weight_decay});

  int64_t start_step = 0, tokens_seen = 0;
  if (!run.continue_from.empty()) {
    const std::string folder = resolve_checkpoint_folder(run.continue_from);
    Checkpoint checkpoint = load_checkpoint(folder);
    LLM_REQUIRE(checkpoint.trainer_state.value("model", nlohmann::json()) == model_config.to_json(),
                folder, "trainer_state.json: model", "the checkpoint was made for another model config");
    load_named_tensors(*model, checkpoint.model, folder + "/model.pt");
    if (pure_bf16) {
      at::NoGradGuard no_grad;
      for (auto& [name, master] : weights.named_masters()) master.copy_(checkpoint.model.at(name));
    }
    optimizer.load_state_dict(checkpoint.optimizer);
    start_step = checkpoint.trainer_state.at("step").get<int64_t>();
    tokens_seen = checkpoint.trainer_state.at("tokens_seen").get<int64_t>();
    train_batches.seek(checkpoint.trainer_state.at("samples_consumed").get<int64_t>());
    log::info("resumed from {} at step {}", folder, start_step);
  }

  metrics.write({{"event", "start"}, {"model", model_config.to_json()}, {"run", run.to_json()},
                 {"world_size", context.world_size}, {"device", device.str()},
                 {"parameters", model_config.num_parameters()},
                 {"corpus_unigram_entropy", corpus.unigram_entropy},
                 {"corpus_entropy_rate", corpus.entropy_rate}, {"start_step", start_step}});
  log::info("model {}: {:.2f}M parameters on {}, {} steps of {} sequences x {} tokens",
            model_config.name, model_config.num_parameters() / 1e6, device.str(),
            run.num_training_steps, run.total_batch_size, run.max_length);

  auto save = [&](int64_t step) {
    if (run.save_dir.empty() || !is_writer) return;
    const std::string folder = (fs::path(run.save_dir) / ("step_" + std::to_string(step))).string();
    save_checkpoint(folder, weights.named_masters(), optimizer.state_dict(),
                    {{"step", step}, {"samples_consumed", train_batches.samples_consumed()},
                     {"tokens_seen", tokens_seen}, {"seed", run.seed},
                     {"model", model_config.to_json()}});
    log::info("saved checkpoint {}", folder);
  };

  TrainingOutcome outcome{start_step, 0, 0, corpus.unigram_entropy, corpus.entropy_rate};
  const int64_t tokens_per_step = run.total_batch_size * run.max_length;
  std::vector<at::Tensor> masters = weights.masters;
  for (int64_t step = start_step + 1; step <= run.num_training_steps; ++step) {
    const auto started = std::chrono::steady_clock::now();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < run.gradient_accumulation; ++micro) {
      Batch batch = to_device(train_batches.next(), device);
      at::Tensor loss;
      {
        AutocastRegion region(device.type(), at::kBFloat16, autocast);
        loss = causal_lm_loss(model->forward(batch.input_ids), batch.labels);
      }
      (loss / static_cast<double>(run.gradient_accumulation)).backward();
      loss_sum += loss.item<double>();
    }
    const double loss = loss_sum / static_cast<double>(run.gradient_accumulation);
    weights.gather_gradients();
    const double grad_norm = clip_gradients(masters, run.grad_clipping);
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
    optimizer.step(lr);
    weights.zero_gradients();
    weights.publish();
    tokens_seen += tokens_per_step;

    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    outcome.steps = step;
    outcome.final_loss = loss;
    if (step % run.log_every == 0 || step == run.num_training_steps)
      metrics.log_step({step, run.num_training_steps, loss, lr, grad_norm,
                        static_cast<double>(tokens_per_step) / seconds, seconds, tokens_seen,
                        peak_memory_bytes(device)});
    const bool last = step == run.num_training_steps;
    if ((run.eval_every > 0 && step % run.eval_every == 0) || last) {
      int64_t eval_tokens = 0;
      outcome.final_eval_loss = evaluate(model, eval_batches, run, device, autocast, &eval_tokens);
      metrics.log_eval(step, outcome.final_eval_loss, eval_tokens);
    }
    if ((run.save_every > 0 && step % run.save_every == 0) || last) save(step);
  }
  metrics.write({{"event", "end"}, {"steps", outcome.steps}, {"final_loss", outcome.final_loss},
                 {"final_eval_loss", outcome.final_eval_loss},
                 {"peak_memory_bytes", peak_memory_bytes(device)}});
  return outcome;
}

}  // namespace llm
