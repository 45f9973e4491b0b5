// One optimizer step (Training::train_step) and evaluation: the micro-batches' forward and backward,
// the loss averaged over ranks, the checks that stop a run before a bad update, clipping and the
// optimizer; and --fuse_optimizer_with_backward's step per unit.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/device.h"
#include "common/errors.h"
#include "sharding/world.h"
#include "common/autocast.h"
#include "trainer/schedule.h"
#include "trainer/training.h"

namespace llm {
namespace {

// On a GPU the batch goes through page-locked memory and its copy is queued without waiting (a
// pageable copy makes the host wait for the GPU); the caching host allocator keeps the page-locked
// block until the copy has read it.
Batch to_device(Batch batch, c10::Device device) {
  if (!device.is_cuda()) return {batch.input_ids.to(device), batch.labels.to(device)};
  return {batch.input_ids.pin_memory().to(device, /*non_blocking=*/true),
          batch.labels.pin_memory().to(device, /*non_blocking=*/true)};
}

// The mean over ranks of a value each rank holds on its device as a double (a loss summed over
// micro-batches in double, as the host would), on the device: the step reads it with the norm.
at::Tensor average_over_ranks(const at::Tensor& value, Communicator& communicator) {
  at::Tensor tensor = value.reshape({1});
  if (communicator.world_size() > 1) {
    tensor = tensor.to(at::kFloat);
    communicator.all_reduce(tensor, ReduceOp::average);
  }
  return tensor;
}

// Global L2 norm over every rank's gradient shard. no_shard ranks each hold the whole gradient: no
// reduction then. Each unit's squared norm (a dot product of its flat shard with itself: one pass, no
// temporary) was taken as the shard was reduced (ShardedUnit::gradient_squares), so with offload the
// shard may be gone to host memory already; the sum runs in unit order, as one pass over the shards
// at the end of the step would.
// The sum of squares, on the device (the step reads it with the loss and takes its root).
at::Tensor global_gradient_squares(ShardedModel& model, Communicator& communicator) {
  at::Tensor squares = at::zeros({1}, model.unit(0).gradient_squares().options());
  for (size_t u = 0; u < model.unit_count(); ++u) squares += model.unit(u).gradient_squares();
  if (model.options().strategy != ShardingStrategy::no_shard) communicator.all_reduce(squares, ReduceOp::sum);
  return squares;
}

// What the gradients are multiplied by to clip them to max_norm (torch's clip_grad_norm_ rule); 1
// when they are within it or clipping is off.
double clip_coefficient(double norm, double max_norm) {
  if (max_norm > 0 && std::isfinite(norm)) {
    const double coefficient = max_norm / (norm + 1e-6);
    if (coefficient < 1.0) return coefficient;
  }
  return 1.0;
}

}  // namespace

double Training::lr_at(int64_t step) const {
  return run_.optimizer.lr * lr_multiplier(run_.optimizer.scheduler, step, run_.optimizer.warmup_steps.value(),
                                           run_.num_training_steps, run_.optimizer.min_lr_ratio);
}

std::string Training::what_to_change() const {
  std::ostringstream out;
  out << "Lower --lr (now " << run_.optimizer.lr << "), ";
  if (!run_.fuse_optimizer_with_backward)
    out << "set --grad_clipping (now " << run_.optimizer.grad_clipping << (run_.optimizer.grad_clipping > 0 ? "" : ", e.g. 1.0")
        << "), ";
  out << (run_.precision.dtype == DType::float32 ? "or raise" : "raise") << " --warmup_steps (now "
      << run_.optimizer.warmup_steps.value() << ")";
  if (run_.precision.dtype != DType::float32) out << ", or use --dtype float32";  // advice an fp32 run cannot take
  return out.str();
}

std::string Training::non_finite_gradients() const {
  std::string names;
  for (size_t u = 0; u < sharded_.unit_count(); ++u)
    if (!std::isfinite(sharded_.unit(u).gradient_squares().item<double>()))
      names += (names.empty() ? "" : ", ") + sharded_.unit(u).name();
  return names.empty() ? "no unit of this rank" : names;
}

// One unit's step on the device; a resident bf16 unit's compute shard rounded from the master in the
// same pass (AdamW's kernels write it as they write the master; the other rules copy after their
// update), so publish_shard has nothing left to copy.
void Training::step_device_unit(size_t unit, double lr, double scale) {
  ShardedUnit& sharded = sharded_.unit(unit);
  if (!sharded.compute_shard_rounds_master()) {
    device_optimizer_->step_unit(unit, lr, scale);
    return;
  }
  device_optimizer_->step_unit(unit, lr, sharded.compute_shard(), scale);
  sharded.compute_shard_written_by_step();
}

void Training::fused_step(size_t unit) {
  ShardedUnit& sharded = sharded_.unit(unit);
  StepTimer::Scope timed(&timer_, StepPhase::optimizer);
  sharded.wait_reduced();  // the step reads the shard on the compute stream
  device_optimizer_->set_unit_gradient(unit, sharded.gradient_shard());
  step_device_unit(unit, fused_lr_, 1.0);
  device_optimizer_->set_unit_gradient(unit, at::Tensor());
  sharded.publish_shard();
  sharded.take_gradient_shard();  // the last reference: the shard is freed here
}

// One optimizer step: each micro-batch's forward and backward (the last one reduces every unit's
// gradients into its shard as its backward ends), the loss averaged over ranks, global-norm clipping,
// the optimizer unit by unit, and the compute shards refreshed from the masters.
// With --fuse_optimizer_with_backward a unit's step runs as soon as its gradient shard is reduced
// (gradient_shard_ready, in the last micro-batch's backward), at the step's lr, and its shard is freed
// right after; clipping is off (validated), so nothing waits for the global norm. A non-finite loss
// stops the run before the last backward (one host read); a non-finite gradient is found by the
// step's one finiteness check, after the units stepped: the run stops naming those units, and nothing
// of the step is saved (a read per unit would drain the GPU once per unit).
StepResult Training::train_step(int64_t step) {
  timer_.begin_step();
  ledger_.begin_step(step);
  if (run_.fuse_optimizer_with_backward) {
    fused_lr_ = lr_at(step);
    device_optimizer_->begin_step();
  }
  if (offload_) offload_->begin_step(lr_at(step));  // --offload_step speculative steps in backward at it
  const int64_t reads_before = host_reads();
  const at::Tensor loss_sum = forward_backward(step);
  StepResult result;
  at::Tensor loss;
  {
    StepTimer::Scope timed(&timer_, StepPhase::collectives);
    loss = average_over_ranks(loss_sum / static_cast<double>(run_.data.gradient_accumulation), communicator_);
  }
  {
    StepTimer::Scope timed(&timer_, StepPhase::optimizer);
    // The loss and the squared norm in one read: the step's one wait for the device before clipping.
    // The squared norms summed over the ranks that shard the units (hybrid: the group, whose replicas
    // hold the same shards after their all-reduce; with the state across the groups, every rank).
    const std::vector<double> read = read_to_host({loss, global_gradient_squares(sharded_, optimizer_communicator_)});
    result.loss = read[0];
    result.grad_norm = std::sqrt(read[1]);
    stop_unless_finite(step, result);
    stop_if_diverged(step, result);
    result.lr = lr_at(step);
    update(result.lr, clip_coefficient(result.grad_norm, run_.optimizer.grad_clipping));
  }
  ledger_.point("optimizer", "", owned_now());
  state_.step = step;
  state_.samples_consumed = train_batches_.samples_consumed();
  state_.tokens_seen += run_.data.total_batch_size * run_.data.max_length;
  result.phase_seconds = timer_.end_step();
  result.phase_step = timer_.reads_late() ? step - 1 : step;
  result.host_reads = host_reads() - reads_before;
  return result;
}

// The micro-batches' forward and backward; their losses summed on the device in double (what the
// host's sum of their values gave), read once, at the end of the step.
at::Tensor Training::forward_backward(int64_t step) {
  const bool fused = run_.fuse_optimizer_with_backward;
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  for (int64_t micro = 0; micro < run_.data.gradient_accumulation; ++micro) {
    Batch batch = to_device(train_batches_.next(), device_);
    ledger_.set_micro_batch(micro);
    live_batch_bytes_ = static_cast<int64_t>(batch.input_ids.nbytes() + batch.labels.nbytes());
    Activations boundaries;
    {
      AutocastRegion region(device_.type(), at::kBFloat16, autocast_);
      boundaries = sharded_.forward(batch.input_ids, Pass::train);
    }
    at::Tensor loss;
    {
      StepTimer::Scope timed(&timer_, StepPhase::forward);
      loss = causal_lm_loss(boundaries.back().output, batch.labels, loss_form_, model_->config().vocab_size);
      loss_sum += loss.detach().to(at::kDouble);
    }
    const bool last = micro + 1 == run_.data.gradient_accumulation;
    const double checked_sum = fused && last ? read_to_host(loss_sum) : 0.0;
    if (!std::isfinite(checked_sum)) {
      std::ostringstream message;
      message << "step " << step << ": the loss is " << checked_sum / static_cast<double>(run_.data.gradient_accumulation)
              << " on this rank; training stopped before the fused backward updated anything. " << what_to_change();
      throw TrainingError(message.str());
    }
    sharded_.backward(boundaries, loss / static_cast<double>(run_.data.gradient_accumulation), /*reduce=*/last);
  }
  live_batch_bytes_ = 0;
  return loss_sum;
}

void Training::stop_unless_finite(int64_t step, const StepResult& result) const {
  if (std::isfinite(result.loss) && std::isfinite(result.grad_norm)) return;
  std::ostringstream message;
  message << "step " << step << ": the loss is " << result.loss << " and the gradient norm " << result.grad_norm;
  if (run_.fuse_optimizer_with_backward)  // only now, on the way out: the units whose gradient is not finite
    message << "; the gradient is not finite in " << non_finite_gradients()
            << " (--fuse_optimizer_with_backward updated the units in this backward; nothing of this step is saved). ";
  else
    message << "; training stopped before the weights were corrupted. "
            << describe_weights_at_divergence(  // names a non-finite (or out-of-range) weight tensor
                   sharded_, [this](size_t u) { return offload_ ? offload_->master(u) : sharded_.unit(u).master_shard(); },
                   optimizer_communicator_, step == start_step_ + 1);
  message << what_to_change();
  throw TrainingError(message.str());
}

// Before this step's update (the fused step made it in backward) and any checkpoint of it.
void Training::stop_if_diverged(int64_t step, const StepResult& result) {
  const std::optional<std::string> reason = divergence_.observe(step, result.loss, result.grad_norm);
  if (!reason) return;
  std::ostringstream message;
  message << "step " << step << ": training has diverged: " << *reason << ". "
          << (run_.fuse_optimizer_with_backward ? "This step's update, made in backward by --fuse_optimizer_with_backward, is not saved. "
                                                : "Stopped before this step's update. ")
          << what_to_change() << "; --divergence_patience 0 turns this check off";
  throw TrainingError(message.str());
}

// The update at lr, the gradients scaled by `scale` (clipping) first.
void Training::update(double lr, double scale) {
  if (run_.fuse_optimizer_with_backward) {
    // Every unit stepped in backward (fused_step), at this lr; scale is 1 (no clipping).
  } else if (offload_) {
    offload_->step(lr, scale);  // each unit's host step; the next forward waits per unit
  } else {
    // The clip coefficient goes to the step, which multiplies as it reads (no pass of its own); a
    // resident bf16 unit's compute shard is written by the step as it writes the master.
    device_optimizer_->begin_step();
    for (const UnitAction& action : sharded_.plan().optimizer_pass()) step_device_unit(action.unit, lr, scale);
    sharded_.publish_shards();
  }
}

// The first `sequences` held-out windows, in corpus order, whatever the world size and micro-batch
// (eval_sequences_of_job, capped at the held-out windows): global sequence k is row k % batch of rank
// (k / batch) % world in micro-step k / (batch * world). Every rank runs every micro-step, since the
// forward gathers; rows past the last sequence are computed and not counted. The loss is the mean
// over the sequences' tokens (every sequence has max_length): each rank sums its micro-steps' means
// weighted by their counted share, and the average over ranks is scaled by the rows run over the
// sequences counted, which is exactly 1 when every micro-step is full (the earlier --eval_batches
// arithmetic, bit for bit).
double Training::evaluate(int64_t* tokens) {
  at::NoGradGuard no_grad;
  eval_batches_.seek(0);
  const int64_t batch_size = run_.data.batch_size, world = communicator_.world_size();
  const int64_t sequences = eval_sequences_;
  const int64_t steps = eval_micro_steps(sequences, run_.data, static_cast<int>(world));
  at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  for (int64_t i = 0; i < steps; ++i) {
    Batch batch = to_device(eval_batches_.next(), device_);
    Activations boundaries;
    {
      AutocastRegion region(device_.type(), at::kBFloat16, autocast_);
      boundaries = sharded_.forward(batch.input_ids, Pass::eval);
    }
    const int64_t first = (i * world + context_.rank) * batch_size;  // this rank's first row's sequence
    const int64_t counted = std::clamp<int64_t>(sequences - first, 0, batch_size);
    if (counted == batch_size) {
      sum += causal_lm_loss(boundaries.back().output, batch.labels, loss_form_, model_->config().vocab_size).to(at::kDouble);
    } else if (counted > 0) {
      const at::Tensor loss = causal_lm_loss(boundaries.back().output.narrow(0, 0, counted),
                                             batch.labels.narrow(0, 0, counted), loss_form_, model_->config().vocab_size);
      sum += loss.to(at::kDouble) * (static_cast<double>(counted) / static_cast<double>(batch_size));
    }
  }
  *tokens += sequences * run_.data.max_length;
  sharded_.release_all();
  const double rows_over_sequences =
      static_cast<double>(steps * world * batch_size) / static_cast<double>(sequences);
  return read_to_host(average_over_ranks(sum / static_cast<double>(steps), communicator_)) * rows_over_sequences;
}

}  // namespace llm
