#include "trainer/metrics.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "common/errors.h"
#include "memory/categories.h"

namespace llm {

MetricsLog::MetricsLog(const std::string& jsonl_path, bool is_writer, bool single_process, bool append)
    : is_writer_(is_writer),
      interactive_(is_writer && single_process && ::isatty(STDOUT_FILENO) == 1) {
  if (!is_writer_) return;
  std::filesystem::create_directories(std::filesystem::path(jsonl_path).parent_path());
  jsonl_.open(jsonl_path, append);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!is_writer_) return;
  jsonl_.write_line(record.dump());
}

void MetricsLog::log_line(const std::string& text) {
  if (!is_writer_) return;
  if (bar_drawn_) std::fputs("\r\033[K", stdout);
  std::fputs(text.c_str(), stdout);
  std::fputc('\n', stdout);
  bar_drawn_ = false;
  std::fflush(stdout);
}

namespace {

nlohmann::json by_phase(const PhaseSeconds& seconds) {
  nlohmann::json phases = nlohmann::json::object();
  for (int phase = 0; phase < kStepPhases; ++phase)
    phases[to_string(static_cast<StepPhase>(phase))] = seconds[static_cast<size_t>(phase)];
  return phases;
}

}  // namespace

void MetricsLog::log_phases_to_tensorboard(int64_t step, const PhaseSeconds& seconds) {
  std::vector<std::pair<std::string, double>> scalars;
  for (int phase = 0; phase < kStepPhases; ++phase)
    scalars.emplace_back("time/" + std::string(to_string(static_cast<StepPhase>(phase))) + "_s",
                         seconds[static_cast<size_t>(phase)]);
  tensorboard_->scalars(step, scalars);
}

void MetricsLog::log_late_phases(int64_t step, const PhaseSeconds& seconds) {
  if (!is_writer_) return;
  write({{"event", "phases"}, {"step", step}, {"phase_s", by_phase(seconds)}});
  if (tensorboard_) log_phases_to_tensorboard(step, seconds);
}

void MetricsLog::log_step(const StepRecord& r) {
  if (!is_writer_) return;
  nlohmann::json record = {{"event", "train"}, {"step", r.step}, {"loss", r.loss}, {"lr", r.lr},
                           {"grad_norm", r.grad_norm}, {"tokens_per_s", r.tokens_per_second}, {"mfu", r.mfu},
                           {"step_time_s", r.step_seconds}, {"tokens_seen", r.tokens_seen},
                           {"peak_rss_bytes", r.peak_rss_bytes},
                           {"peak_memory_bytes", r.peak_memory_bytes},
                           {"peak_memory_source", r.peak_on_cuda ? "cuda_allocated" : "rss"},
                           {"projector_s", r.projector_seconds},
                           {"phase_s", r.phase_seconds ? by_phase(*r.phase_seconds) : nlohmann::json()},
                           {"phase_s_step", r.phase_seconds ? nlohmann::json(r.phase_step) : nlohmann::json()},
                           {"host_phase_s", by_phase(r.host_phase_seconds)},
                           {"host_reads", r.host_reads}};
  if (r.peak_on_cuda) record["peak_cuda_allocated_bytes"] = r.peak_memory_bytes;
  if (r.offloaded)
    record["offload"] = {{"host_step_s", r.offload_host_step_seconds}, {"wait_s", r.offload_wait_seconds}};
  const auto link = [](const LinkTraffic& traffic) {
    return nlohmann::json{{"bytes", traffic.bytes_sent}, {"s", traffic.seconds}, {"collectives", traffic.collectives}};
  };
  record["links"] = {{"group", link(r.group)}, {"across", link(r.across)}, {"node", link(r.node)}};
  record["straggler"] = r.straggler ? nlohmann::json{{"rank", r.straggler->rank},
                                                     {"compute_s", r.straggler->compute_seconds},
                                                     {"others_median_s", r.straggler->median_seconds}}
                                    : nlohmann::json();
  write(record);
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> scalars = {
        {"train/loss", r.loss}, {"train/lr", r.lr}, {"train/grad_norm", r.grad_norm},
        {"train/tokens_per_s", r.tokens_per_second}, {"train/mfu", r.mfu}, {"train/step_time_s", r.step_seconds},
        {"train/tokens_seen", static_cast<double>(r.tokens_seen)},
        {r.peak_on_cuda ? "memory/peak_cuda_allocated_bytes" : "memory/peak_rss_bytes", static_cast<double>(r.peak_memory_bytes)},
        {"comm/group_bytes", static_cast<double>(r.group.bytes_sent)}, {"comm/across_bytes", static_cast<double>(r.across.bytes_sent)},
        {"comm/node_bytes", static_cast<double>(r.node.bytes_sent)}};
    tensorboard_->scalars(r.step, scalars);
    if (r.phase_seconds) log_phases_to_tensorboard(r.phase_step, *r.phase_seconds);
  }
  // Each memory figure names its source: the CUDA allocator's peak allocated bytes, or the peak RSS.
  char mfu[32] = "";
  if (r.mfu > 0) std::snprintf(mfu, sizeof(mfu), " | mfu %.1f%%", 100 * r.mfu);
  char line[256];
  std::snprintf(line, sizeof(line),
                "step %6lld/%lld | loss %.4f | lr %.3e | grad_norm %.3f | tok/s %.0f%s | %s %s",
                static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss, r.lr,
                r.grad_norm, r.tokens_per_second, mfu, r.peak_on_cuda ? "peak_allocated" : "peak_rss",
                human_bytes(r.peak_memory_bytes).c_str());
  log_line(line);
  if (interactive_) draw_progress(r.step, r.total_steps);
}

void MetricsLog::log_eval(int64_t step, double eval_loss, int64_t eval_tokens) {
  if (!is_writer_) return;
  write({{"event", "eval"}, {"step", step}, {"eval_loss", eval_loss}, {"eval_tokens", eval_tokens}});
  if (tensorboard_) tensorboard_->scalars(step, {{"eval/loss", eval_loss}});
  char line[160];
  std::snprintf(line, sizeof(line), "eval @ step %lld | eval_loss %.4f | %lld tokens",
                static_cast<long long>(step), eval_loss, static_cast<long long>(eval_tokens));
  log_line(line);
}

void MetricsLog::attach_tensorboard(std::unique_ptr<TensorBoardWriter> writer) {
  if (is_writer_) tensorboard_ = std::move(writer);
}

void MetricsLog::checkpoint_written(int64_t step, const std::string& folder) {
  if (tensorboard_) tensorboard_->checkpoint(step, folder);
}

void MetricsLog::draw_progress(int64_t step, int64_t total) {
  constexpr int kWidth = 30;
  const double fraction = total > 0 ? static_cast<double>(step) / static_cast<double>(total) : 1.0;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = fraction > 0 ? elapsed * (1.0 - fraction) / fraction : 0.0;
  std::string bar(kWidth, ' ');
  for (int i = 0; i < static_cast<int>(fraction * kWidth); ++i) bar[i] = '#';
  std::printf("[%s] %3.0f%% %lld/%lld elapsed %s ETA %s", bar.c_str(), fraction * 100.0,
              static_cast<long long>(step), static_cast<long long>(total),
              format_duration(elapsed).c_str(), format_duration(eta).c_str());
  std::fflush(stdout);
  bar_drawn_ = true;
}

std::string format_duration(double seconds) {
  const long long total = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (total >= 3600)
    std::snprintf(text, sizeof(text), "%lldh%02lldm%02llds", total / 3600, total / 60 % 60, total % 60);
  else
    std::snprintf(text, sizeof(text), "%lldm%02llds", total / 60, total % 60);
  return text;
}

}  // namespace llm
