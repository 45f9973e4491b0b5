#include "trainer/run_checkpoints.h"

#include <chrono>
#include <exception>
#include <filesystem>
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/train_state.h"
#include "common/log.h"
#include "common/memory_stats.h"
#include "common/step_timer.h"
#include "common/watchdog.h"
#include "data/batches.h"
#include "data/token_corpus.h"
#include "memory/categories.h"
#include "offload/optimizer_offload.h"
#include "optim/shard_optimizer.h"
#include "sharding/sharded_model.h"
#include "sharding/world.h"
#include "trainer/metrics.h"
#include "trainer/train_loop.h"

namespace llm {
namespace fs = std::filesystem;
RunCheckpoints::RunCheckpoints(const ModelConfig& model_config, const RunConfig& run, const RuntimeContext& context,
                               CheckpointedState state, MetricsLog& metrics)
    : model_config_(model_config), run_(run), context_(context), state_(state), metrics_(metrics) {}

RunCheckpoints::~RunCheckpoints() = default;

bool RunCheckpoints::background_save_written() const {
  return background_save_ == nullptr || background_save_->written();
}

at::Tensor RunCheckpoints::master(size_t unit) const {
  return state_.offload ? state_.offload->master(unit) : state_.model.unit(unit).master_shard();
}

// Unit u's master rows as parts of the full parameters: each parameter's real rows (padding rows
// are not saved), a view of the master shard (the host master with offload).
std::vector<StatePiece> RunCheckpoints::master_pieces(size_t u) const {
  const at::Tensor master_shard = master(u);
  std::vector<StatePiece> pieces;
  for (const ShardedParameter& p : state_.model.unit(u).layout().parameters)
    if (p.rows_held > 0)
      pieces.push_back({p.name, p.full_shape, p.first_row * p.cols, master_shard.narrow(0, p.shard_offset, p.rows_held * p.cols)});
  return pieces;
}

SaveRole RunCheckpoints::save_role() const {
  // Hybrid sharding: one copy of each replicated shard, group 0's, under its shard index.
  // With the state across the groups every rank writes its world shard (rank k G + g of the layout).
  if (is_hybrid(run_.sharding.strategy) && run_.sharding.optimizer_across_groups)
    return {true, context_.topology.world_shard()};
  if (is_hybrid(run_.sharding.strategy)) return {context_.topology.group == 0, context_.topology.shard};
  return {};
}

RunCheckpoints::Checkpoint RunCheckpoints::checkpoint_of(int64_t step) {
  if (state_.offload) state_.offload->wait_all();
  Checkpoint checkpoint;
  if (save_role().writes && (context_.rank == 0 || run_.sharding.strategy != ShardingStrategy::no_shard)) {
    for (size_t u = 0; u < state_.model.unit_count(); ++u)
      for (StatePiece& piece : master_pieces(u)) checkpoint.pieces.push_back(std::move(piece));
    for (StatePiece& piece : state_.optimizer.state_pieces()) checkpoint.pieces.push_back(std::move(piece));
  }
  checkpoint.manifest = state_.position.to_json();
  checkpoint.manifest["run_id"] = run_id_;
  // (world_size, the files' world, is the save's: one group's under hybrid sharding)
  checkpoint.manifest["sharding"] = {{"strategy", to_string(run_.sharding.strategy)}, {"ranks", context_.world_size},
                                     {"group_size", shard_world(run_, context_.world_size)}};
  checkpoint.manifest["optimizer"] = run_.optimizer.name;
  checkpoint.manifest["optimizer_step"] = state_.optimizer.steps_taken();
  checkpoint.manifest["optimizer_state_dtype"] = run_.optimizer.state_dtype;  // the dtype its moments are saved in
  checkpoint.manifest["model"] = model_config_.to_json();
  checkpoint.manifest["run"] = run_.to_json();  // the settings that wrote it, for the record
  // `trainer export` looks for the tokenizer `trainer prepare` trained beside the token file.
  checkpoint.manifest["data"] =
      run_.data.source == "synthetic" ? run_.data.source : absolute_data_spec(run_.data.source);
  checkpoint.manifest["data_identity"] = data_identity_;
  checkpoint.folder = (fs::path(run_.checkpoint.save_dir) / ("step_" + std::to_string(step))).string();
  return checkpoint;
}

std::string RunCheckpoints::save(int64_t step) {
  const auto started = std::chrono::steady_clock::now();
  Checkpoint checkpoint = checkpoint_of(step);
  save_checkpoint(checkpoint.folder, checkpoint.pieces, std::move(checkpoint.manifest), *context_.communicator,
                  save_role());
  saved(checkpoint.folder, step, step, seconds_since(started));
  return checkpoint.folder;
}

void RunCheckpoints::saved(const std::string& folder, int64_t step, int64_t completed_at, double blocked_seconds) {
  metrics_.write({{"event", "checkpoint"}, {"step", step}, {"folder", folder}, {"completed_at_step", completed_at},
                  {"background", completed_at != step}, {"blocked_s", blocked_seconds}});
  metrics_.checkpoint_written(step, folder);
  if (context_.rank != 0) return;
  if (completed_at == step)
    log::info("saved checkpoint {}", folder);
  else
    log::info("saved checkpoint {} (written in the background during steps {}-{})", folder, step + 1, completed_at);
  for (const std::string& removed : remove_old_checkpoints(folder, run_id_, run_.checkpoint.keep_last))
    log::info("removed checkpoint {} (--keep_last {})", removed, run_.checkpoint.keep_last);
  for (const std::string& removed : remove_stale_staging(folder, step))
    log::info("removed {}: a killed save's staging folder, superseded by {}", removed, folder);
}

// The pieces are copied to host memory first, so the steps that follow cannot change what is written:
// into one flat buffer made at the first save and kept (a save completes before the next starts),
// page-locked on a GPU for the copy's speed, at its exact size (common/memory_stats.h). A rank that
// cannot make its copy (out of host memory) fails the save on every rank at its first collective.
void RunCheckpoints::start_background_save(int64_t step) {
  const auto started = std::chrono::steady_clock::now();
  Checkpoint checkpoint = checkpoint_of(step);
  // One host buffer of bytes holds every piece in its own dtype (bf16 optimizer state is saved as
  // bf16, as the synchronous save writes it), each at a 64-byte boundary.
  const auto aligned = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  int64_t bytes = 0;
  for (const StatePiece& piece : checkpoint.pieces) bytes += aligned(static_cast<int64_t>(piece.values.nbytes()));
  std::exception_ptr failure;
  try {
    at::NoGradGuard no_grad;
    if (bytes > 0 && (!save_copy_.defined() || save_copy_.numel() < bytes)) {  // (a replica saves nothing)
      save_copy_ = at::Tensor();  // the smaller one goes first
      save_copy_ = exact_host_buffer(bytes, at::kByte, state_.offload ? c10::Device(c10::kCPU) : context_.device);
    }
    int64_t offset = 0;
    for (StatePiece& piece : checkpoint.pieces) {
      const int64_t piece_bytes = static_cast<int64_t>(piece.values.nbytes());
      at::Tensor copy =
          save_copy_.narrow(0, offset, piece_bytes).view(piece.values.scalar_type()).view(piece.values.sizes());
      copy.copy_(piece.values);
      piece.values = std::move(copy);
      offset += aligned(piece_bytes);
    }
  } catch (...) {
    failure = std::current_exception();
    checkpoint.pieces.clear();
  }
  background_save_ = std::make_unique<BackgroundSave>(checkpoint.folder, std::move(checkpoint.pieces),
                                                      std::move(checkpoint.manifest), *context_.communicator, failure,
                                                      save_role());
  background_save_step_ = step;
  background_save_blocked_ = seconds_since(started);
  log::info("saving checkpoint {} in the background (a host copy of {} on this rank)", checkpoint.folder,
            human_bytes(bytes));
}

void RunCheckpoints::finish_background_save(int64_t completed_at) {
  const auto started = std::chrono::steady_clock::now();
  background_save_->commit();
  const std::string folder = background_save_->folder();
  background_save_.reset();
  saved(folder, background_save_step_, completed_at, background_save_blocked_ + seconds_since(started));
}

// A checkpoint of any world size: each rank reads its own rows of every parameter and its part of
// the optimizer state from the saved ranks' parts (CheckpointReader), and the run's position.
void RunCheckpoints::resume(const std::string& folder) {
  StallWatchdog::mark("start-up: reading the checkpoint");
  const CheckpointReader checkpoint(folder);
  const nlohmann::json& manifest = checkpoint.manifest();
  require_same_model(folder, manifest, model_config_);
  const std::string manifest_path = folder + "/manifest.json";
  const TrainState saved = TrainState::from_json(manifest, manifest_path);
  const std::string saved_optimizer = manifest.value("optimizer", std::string());
  LLM_REQUIRE(saved_optimizer == run_.optimizer.name, manifest_path, "optimizer",
              "the checkpoint was written by --optimizer " + saved_optimizer + "; resume with it (got --optimizer " +
                  run_.optimizer.name + ")");
  LLM_REQUIRE(manifest.contains("optimizer_step") && manifest.at("optimizer_step").is_number_unsigned(), manifest_path,
              "optimizer_step", "missing or not an integer >= 0");
  if (manifest.contains("seed") && saved.seed != run_.seed)
    log::warn("resuming a run saved with --seed {} under --seed {}: the data order from here on is --seed {}'s",
              saved.seed, run_.seed, run_.seed);
  ShardedModel& model = state_.model;
  std::map<std::string, FullStateShape> expected = state_.optimizer.full_state_shapes();
  for (size_t u = 0; u < model.unit_count(); ++u)
    for (const ShardedParameter& p : model.unit(u).layout().parameters) expected[p.name] = {p.full_shape};
  checkpoint.check(expected, "the model and its " + run_.optimizer.name + " state");

  for (size_t u = 0; u < model.unit_count(); ++u) {
    master(u).zero_();  // padding rows stay zero
    for (const StatePiece& piece : master_pieces(u)) checkpoint.read(piece.key, piece.begin, piece.values);
  }
  // Moments saved in another dtype convert as they are read (CheckpointReader::read): bf16 into fp32
  // exactly, fp32 into bf16 rounded to nearest even.
  const std::string saved_state_dtype = manifest.value("optimizer_state_dtype", std::string("float32"));
  if (saved_state_dtype != run_.optimizer.state_dtype)
    log::info("resuming {} optimizer state as {} (--optimizer_state_dtype){}", saved_state_dtype,
              run_.optimizer.state_dtype,
              run_.optimizer.state_dtype == "bfloat16" ? ": each moment rounded to the nearest bf16" : ": exact");
  state_.optimizer.load_state_pieces(
      [&](const std::string& key, int64_t begin, const at::Tensor& destination) { checkpoint.read(key, begin, destination); },
      manifest.at("optimizer_step").get<int64_t>());
  // The loaded masters to the rows the model computes with (and, offloaded, what the device keeps
  // of the state: GaLore's projectors).
  if (state_.offload)
    for (size_t u = 0; u < model.unit_count(); ++u) state_.offload->publish(u);
  else
    model.publish_shards();
  state_.train_batches.seek(saved.samples_consumed);
  state_.position.step = saved.step;
  state_.position.samples_consumed = saved.samples_consumed;
  state_.position.tokens_seen = saved.tokens_seen;
  run_id_ = manifest.value("run_id", run_id_);
  resumed_from_ = folder;
  log::info("resumed from {} at step {} (saved by {} rank(s))", folder, saved.step, manifest.value("world_size", 0));
}

void RunCheckpoints::agree_on_run_id() {
  run_id_ = run_id_.empty() ? all_gather_text(new_run_id()).front() : run_id_;
}

}  // namespace llm
