// --offload_step speculative (offload/optimizer_offload.h) through the trainer binary on CPU: every
// unit stepped on the host as its gradient lands in backward, as if no clipping were needed, and
// adopted or stepped again once the global norm is known, equals the step without offload bitwise
// for each optimizer, precision, strategy and offload set at 1 to 4 ranks, in runs whose clipping
// fires on some steps and not on others; it resumes exactly, also at another world size, and a
// non-finite gradient stops it with the last step's weights. And the schedule itself, from the
// events --offload_trace records (their order, never their times): what is stepped when, on which
// thread, and what the next forward waits for, in both modes.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "tests/micro_runs.h"
#include "tests/rounding_bounds.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::offload_schedule_test {
namespace {

using nlohmann::json;

struct ScheduleCase {
  std::string name;
  int ranks;
  std::string flags;
  std::string offload = "optimizer";  // --offload's set in the offloaded run
};

const testing::RecordedRun& micro_run(const ScheduleCase& c, const std::string& more = "") {
  return testing::recorded_run(c.ranks, testing::micro_run_flags(c.ranks, c.flags + more));
}

std::vector<double> grad_norms(const testing::RecordedRun& run) {
  std::vector<double> norms;
  for (const json& step : testing::read_metrics_events(run.run_dir(), "train")) norms.push_back(step.at("grad_norm").get<double>());
  return norms;
}

// A --grad_clipping between the norms the case's runs see, printed exactly, so the runs below clip on
// some steps and not on others: the midpoint of the widest gap between two of the default micro run's
// norms (sorted). Never a norm itself (a clipped run reproduces that step's norm to within rounding:
// Adam ignores a constant clip coefficient), nor between two norms 0.05 % apart, which rounding could
// put on either side (a median once did both).
std::string clipping_between_norms(const ScheduleCase& c) {
  const testing::RecordedRun& probe = micro_run(c);
  EXPECT_EQ(probe.exit_code, 0) << probe.output;
  std::vector<double> norms = grad_norms(probe);
  std::sort(norms.begin(), norms.end());
  double threshold = 1.0, widest = -1;
  for (size_t i = 0; i + 1 < norms.size(); ++i)
    if (const double gap = (norms[i + 1] - norms[i]) / norms[i]; gap > widest) {
      widest = gap;
      threshold = (norms[i] + norms[i + 1]) / 2;
    }
  std::ostringstream text;
  text.precision(17);
  text << " --grad_clipping " << threshold;
  return text.str();
}

double threshold_of(const std::string& clipping) { return std::stod(clipping.substr(clipping.rfind(' ') + 1)); }

std::vector<json> read_trace(const std::filesystem::path& run_dir, int rank) {
  std::ifstream in(run_dir / ("offload_trace.rank" + std::to_string(rank) + ".jsonl"));
  std::vector<json> events;
  for (std::string line; std::getline(in, line);) events.push_back(json::parse(line));
  return events;
}

std::vector<double> losses(const std::filesystem::path& run_dir) {
  std::vector<double> values;
  for (const json& step : testing::read_metrics_events(run_dir, "train")) values.push_back(step.at("loss"));
  return values;
}

// The checkpoint folders' parameters and optimizer state, bit for bit.
void expect_same_checkpoint(const std::filesystem::path& expected, const std::filesystem::path& actual) {
  const testing::Checkpoint want = testing::load_checkpoint(expected.string());
  const testing::Checkpoint got = testing::load_checkpoint(actual.string());
  ASSERT_EQ(got.model.size(), want.model.size());
  ASSERT_EQ(got.optimizer.size(), want.optimizer.size());
  for (const auto& [key, tensor] : want.model) EXPECT_TRUE(at::equal(got.model.at(key), tensor)) << key;
  for (const auto& [key, tensor] : want.optimizer) EXPECT_TRUE(at::equal(got.optimizer.at(key), tensor)) << key;
}

const std::string kLastStep = "step_" + std::to_string(testing::kMicroSteps);

// A micro run of `ranks` resumed from `checkpoint` into dir's run/ and ckpt/.
void resume_micro_run(int ranks, const std::string& flags, const std::string& checkpoint, const testing::ScratchDir& dir) {
  const auto result = testing::run_command(testing::trainer_launcher(ranks) + " " + testing::micro_run_flags(ranks, flags) +
                                           " --continue_from " + checkpoint + " --run_dir " + (dir / "run").string() +
                                           " --save_dir " + (dir / "ckpt").string());
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

std::string speculative_flags(const ScheduleCase& c) {
  return " --offload " + c.offload + " --offload_step speculative --offload_trace";
}

class SpeculativeStep : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(SpeculativeStep, EqualsTheStepWithoutOffloadBitwiseWhetherClippingFiresOrNot) {
  const ScheduleCase& c = GetParam();
  const std::string clipping = clipping_between_norms(c);
  const testing::RecordedRun& plain = micro_run(c, clipping);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const testing::RecordedRun& speculative = micro_run(c, clipping + speculative_flags(c));
  ASSERT_EQ(speculative.exit_code, 0) << speculative.output;
  testing::expect_same_run(plain.dir, speculative.dir, testing::kMicroSteps);
  // The default host step too, at the same clipping (OffloadEquivalence's runs clip at every step).
  const testing::RecordedRun& host = micro_run(c, clipping + " --offload " + c.offload);
  ASSERT_EQ(host.exit_code, 0) << host.output;
  testing::expect_same_run(plain.dir, host.dir, testing::kMicroSteps);
  // And with a worker that lags (10 ms before each task): the next step's forward and backward run
  // ahead of this step's host steps, whatever this machine's speed.
  const testing::RecordedRun& lagging = testing::recorded_run(
      c.ranks, testing::micro_run_flags(c.ranks, c.flags + clipping + speculative_flags(c)), "LLM_DEBUG_OFFLOAD_LAG_MS=10");
  ASSERT_EQ(lagging.exit_code, 0) << lagging.output;
  testing::expect_same_run(plain.dir, lagging.dir, testing::kMicroSteps);

  // Clipping fires on some steps and not on others, by the trainer's rule and clearly; each step's
  // verdict follows its norm, and where clipping did not fire the speculative steps were the steps.
  const double threshold = threshold_of(clipping);
  testing::expect_clips_on_some_steps(grad_norms(plain), threshold);
  testing::expect_speculative_verdicts(speculative.run_dir(), c.ranks, grad_norms(plain), threshold);
}

const ScheduleCase kCases[] = {
    {"adamw_1rank", 1, testing::micro_case("adamw").flags},
    {"adamw_4ranks", 4, testing::micro_case("adamw").flags},
    {"adamw_sn_1rank", 1, testing::micro_case("adamw_sn_general_all").flags},
    // Sharded AdamwSN and GaLore units step after the norm on the main thread (their collectives).
    {"adamw_sn_4ranks", 4, testing::micro_case("adamw_sn_general_all").flags},
    {"galore_1rank", 1, testing::micro_case("galore_right").flags},
    {"galore_3ranks", 3, testing::micro_case("galore_right").flags},
    {"adamw_pure_bf16_1rank", 1, "--optimizer adamw --lr 1e-2 --dtype bfloat16 --precision pure"},
    {"adamw_pure_bf16_4ranks", 4, "--optimizer adamw --lr 1e-2 --dtype bfloat16 --precision pure"},
    {"adamw_mixed_bf16_shard_grad_op_2ranks", 2,
     "--optimizer adamw --lr 1e-2 --dtype bfloat16 --precision mixed --sharding shard_grad_op"},
    {"adamw_sn_no_shard_2ranks", 2, "--optimizer adamw_sn --lr 2e-2 --sharding no_shard"},
    {"adamw_bf16_state_2ranks", 2, testing::micro_case("adamw").flags + " --optimizer_state_dtype bfloat16"},
    {"adamw_parameters_offloaded_2ranks", 2, testing::micro_case("adamw").flags + " --offload parameters",
     "optimizer,parameters"},
};

INSTANTIATE_TEST_SUITE_P(Cases, SpeculativeStep, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// --offload_step device: the step without offload's own kernel over copies of the host-resident
// master and state (on a CPU rank the "device" is the host: the same schedule, in-line copies), so
// no offload's bits; the two windows are the device's optimizer bytes, and the gradient shards stay.
class OffloadOnDevice : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(OffloadOnDevice, EqualsTheStepWithoutOffloadBitwise) {
  const ScheduleCase& c = GetParam();
  const std::string clipping = clipping_between_norms(c);
  const testing::RecordedRun& plain = micro_run(c, clipping);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const testing::RecordedRun& device = micro_run(c, clipping + " --offload optimizer --offload_step device --offload_trace");
  ASSERT_EQ(device.exit_code, 0) << device.output;
  testing::expect_same_run(plain.dir, device.dir, testing::kMicroSteps);
  testing::expect_clips_on_some_steps(grad_norms(plain), threshold_of(clipping));
  for (int r = 0; r < c.ranks; ++r) {
    const auto points = testing::read_ledger_events(device.run_dir(), r, "point");
    ASSERT_FALSE(points.empty());
    const auto plain_points = testing::read_ledger_events(plain.run_dir(), r, "point");
    const int64_t plain_state = plain_points.front().at("optimizer_device");
    for (const json& point : points) {
      EXPECT_GT(point.at("optimizer_device").get<int64_t>(), 0) << "rank " << r << ": the two windows";
      EXPECT_GT(point.at("optimizer_host").get<int64_t>(), plain_state) << "rank " << r << ": the state and the masters";
    }
  }
  // The gradient shards stay on the device (the step reads them there), as without offload.
  const auto plain_shards = testing::read_metrics_events(plain.run_dir(), "sharded_state").at(0).at("ranks");
  const auto device_shards = testing::read_metrics_events(device.run_dir(), "sharded_state").at(0).at("ranks");
  for (int r = 0; r < c.ranks; ++r)
    EXPECT_EQ(device_shards[r].at("gradient_shard_bytes"), plain_shards[r].at("gradient_shard_bytes")) << "rank " << r;
}

const ScheduleCase kDeviceCases[] = {
    {"adamw_1rank", 1, testing::micro_case("adamw").flags},
    {"adamw_4ranks", 4, testing::micro_case("adamw").flags},
    {"adamw_sn_1rank", 1, testing::micro_case("adamw_sn_general_all").flags},
    {"galore_1rank", 1, testing::micro_case("galore_right").flags},
    {"adamw_pure_bf16_1rank", 1, "--optimizer adamw --lr 1e-2 --dtype bfloat16 --precision pure"},
    {"adamw_pure_bf16_4ranks", 4, "--optimizer adamw --lr 1e-2 --dtype bfloat16 --precision pure"},
    {"adamw_mixed_bf16_shard_grad_op_2ranks", 2,
     "--optimizer adamw --lr 1e-2 --dtype bfloat16 --precision mixed --sharding shard_grad_op"},
    {"adamw_sn_no_shard_2ranks", 2, "--optimizer adamw_sn --lr 2e-2 --sharding no_shard"},
    {"adamw_bf16_state_3ranks", 3, testing::micro_case("adamw").flags + " --optimizer_state_dtype bfloat16"},
};

INSTANTIATE_TEST_SUITE_P(Cases, OffloadOnDevice, ::testing::ValuesIn(kDeviceCases),
                         [](const auto& info) { return info.param.name; });

// Saved with the device step at step 3 (its masters and state copied back before the save), resumed
// with the default host step: the plain run's bits to the end. Resumed by 3 ranks (resharded) with
// the device step: the bits of the same checkpoint resumed by 3 without offload.
TEST(OffloadOnDevice, ItsCheckpointResumesExactlyInAnotherMode) {
  const ScheduleCase c{"adamw_2ranks", 2, testing::micro_case("adamw").flags};
  const std::string clipping = clipping_between_norms(c);
  const testing::RecordedRun& plain = micro_run(c, clipping);
  const testing::RecordedRun& saved = micro_run(c, clipping + " --offload optimizer --offload_step device");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  testing::expect_clips_on_some_steps(grad_norms(plain), threshold_of(clipping));
  testing::ScratchDir dir("device_step_resume");
  resume_micro_run(2, c.flags + clipping + " --offload optimizer",
                   (saved.save_dir() / ("step_" + std::to_string(testing::kMicroSaveAt))).string(), dir);
  const std::vector<double> whole = losses(plain.run_dir()), rest = losses(dir / "run");
  ASSERT_EQ(rest.size(), static_cast<size_t>(testing::kMicroSteps - testing::kMicroSaveAt));
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], whole[testing::kMicroSaveAt + i]) << "step " << i + 4;
  expect_same_checkpoint(plain.save_dir() / kLastStep, dir / "ckpt" / kLastStep);

  const std::string checkpoint = (saved.save_dir() / ("step_" + std::to_string(testing::kMicroSaveAt))).string();
  testing::ScratchDir three_plain("device_step_reshard_plain"), three_device("device_step_reshard");
  resume_micro_run(3, c.flags + clipping, checkpoint, three_plain);
  resume_micro_run(3, c.flags + clipping + " --offload optimizer --offload_step device", checkpoint, three_device);
  EXPECT_EQ(losses(three_device / "run"), losses(three_plain / "run"));
  expect_same_checkpoint(three_plain / "ckpt" / kLastStep, three_device / "ckpt" / kLastStep);
}

// Saved by a speculative run of 4 ranks at step 3 and resumed speculatively by 4: the plain run's
// bits to the end. Resumed by 2 (resharded): the bits of the same checkpoint resumed by 2 without
// offload (Reshard checks that against the uninterrupted run, to its tolerance).
TEST(SpeculativeStep, ResumesExactlyAtTheSameAndAtAnotherWorldSize) {
  const ScheduleCase c{"adamw_4ranks", 4, testing::micro_case("adamw").flags};
  const std::string clipping = clipping_between_norms(c);
  const testing::RecordedRun& plain = micro_run(c, clipping);
  const testing::RecordedRun& saved = micro_run(c, clipping + speculative_flags(c));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const std::string checkpoint = (saved.save_dir() / ("step_" + std::to_string(testing::kMicroSaveAt))).string();
  testing::ScratchDir same("speculative_resume_4");
  resume_micro_run(4, c.flags + clipping + speculative_flags(c), checkpoint, same);
  const std::vector<double> whole = losses(plain.run_dir()), resumed = losses(same / "run");
  ASSERT_EQ(resumed.size(), static_cast<size_t>(testing::kMicroSteps - testing::kMicroSaveAt));
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], whole[testing::kMicroSaveAt + i]) << "step " << i + 4;
  expect_same_checkpoint(plain.save_dir() / kLastStep, same / "ckpt" / kLastStep);

  testing::ScratchDir two_plain("speculative_reshard_plain"), two_speculative("speculative_reshard_2");
  resume_micro_run(2, c.flags + clipping, checkpoint, two_plain);
  resume_micro_run(2, c.flags + clipping + speculative_flags(c), checkpoint, two_speculative);
  EXPECT_EQ(losses(two_speculative / "run"), losses(two_plain / "run"));
  expect_same_checkpoint(two_plain / "ckpt" / kLastStep, two_speculative / "ckpt" / kLastStep);
}

// A run whose gradient turns non-finite: with --lr 1e4 step 1 blows the weights up and step 2's loss
// and gradient are not finite. The speculative steps of step 2 ran into the second buffers; the run
// stops with exit 3 and describes the weights of step 1, as the exact offload does, and the
// checkpoint of step 1 is the same.
TEST(SpeculativeStep, ANonFiniteGradientStopsWithTheLastStepsWeights) {
  const std::string base = testing::micro_run_flags(1, "--optimizer adamw --lr 1e4 --warmup_steps 0 --grad_clipping 0 "
                                                       "--save_every 1");
  testing::ScratchDir host("speculative_nan_host"), speculative("speculative_nan");
  const auto run = [&](const std::string& more, const testing::ScratchDir& dir) {
    return testing::run_command(testing::trainer_launcher(1) + " " + base + more + " --run_dir " + (dir / "run").string() +
                                " --save_dir " + (dir / "ckpt").string());
  };
  const auto exact = run(" --offload optimizer", host);
  const auto stepped = run(" --offload optimizer --offload_step speculative --offload_trace", speculative);
  ASSERT_EQ(exact.exit_code, 3) << exact.output;
  ASSERT_EQ(stepped.exit_code, 3) << stepped.output;
  const auto stop_line = [](const std::string& output) {
    const size_t at = output.find("the loss is");
    return at == std::string::npos ? std::string() : output.substr(at, output.find('\n', at) - at);
  };
  EXPECT_FALSE(stop_line(exact.output).empty()) << exact.output;
  EXPECT_EQ(stop_line(stepped.output), stop_line(exact.output));
  expect_same_checkpoint(host / "ckpt/step_1", speculative / "ckpt/step_1");
}

// The schedule, from the recorded events' order. Both modes: every unit's gradient lands before the
// step's norm; a unit's rows go out (sent) only after its update; and the next forward reads a unit
// (read) only after its rows went out. host: every update starts after the norm, the embedding's
// first (the next forward's first read). speculative: every unit's step is queued as its gradient
// lands, before the norm, and runs on the worker; after the norm each unit is adopted or stepped
// again, never both, and the norm's verdict decides which.
void expect_schedule(const std::vector<json>& events, bool speculative, int units, const std::string& what,
                     int* speculated_units) {
  std::map<int64_t, int64_t> norm;  // step -> its norm's sequence number
  std::map<std::tuple<int64_t, int64_t, std::string>, int64_t> at;  // (step, unit, what) -> sequence
  std::map<int64_t, std::vector<int64_t>> stepped_order;  // step -> units in the order their update began
  for (const json& event : events) {
    const int64_t step = event.at("step"), seq = event.at("seq");
    const std::string kind = event.at("what");
    if (kind.starts_with("norm")) {
      norm[step] = seq;
      continue;
    }
    const int64_t unit = event.at("unit");
    if (kind == "read" || kind == "read_wait") {  // the first after the step (the next forward's)
      at.try_emplace({step, unit, kind}, seq);
      continue;
    }
    EXPECT_TRUE(at.emplace(std::tuple{step, unit, kind}, seq).second) << what << ": " << kind << " twice";
    if (kind == "step_begin" || kind == "speculate_begin") stepped_order[step].push_back(unit);
    if (kind == "speculate_begin" || kind == "restep_begin" || (kind == "step_begin" && !what.starts_with("device")))
      EXPECT_EQ(event.at("thread"), "worker") << what << ": " << event.dump();
  }
  ASSERT_EQ(norm.size(), static_cast<size_t>(testing::kMicroSteps)) << what;
  for (const auto& [step, norm_seq] : norm) {
    SCOPED_TRACE(what + ", step " + std::to_string(step));
    const auto seq = [&](int64_t unit, const std::string& kind) {
      const auto found = at.find({step, unit, kind});
      return found == at.end() ? int64_t{-1} : found->second;
    };
    for (int64_t u = 0; u < units; ++u) {
      ASSERT_GE(seq(u, "gradient"), 0) << "unit " << u;
      EXPECT_LT(seq(u, "gradient"), norm_seq) << "unit " << u;
      // A speculative step the worker had not begun when the norm came is stepped as without speculation.
      const bool speculated = seq(u, "speculate_begin") >= 0;
      const int64_t updated = speculated ? std::max(seq(u, "adopt"), seq(u, "restep_end")) : seq(u, "step_end");
      ASSERT_GE(updated, 0) << "unit " << u;
      EXPECT_GT(updated, norm_seq) << "unit " << u << ": decided by the norm";
      EXPECT_GT(seq(u, "sent"), updated) << "unit " << u;
      if (step < testing::kMicroSteps) EXPECT_GT(seq(u, "read"), seq(u, "sent")) << "unit " << u << ": the next forward";
      if (speculative) {
        EXPECT_GT(seq(u, "speculate_queued"), seq(u, "gradient")) << "unit " << u;
        EXPECT_LT(seq(u, "speculate_queued"), norm_seq) << "unit " << u << ": queued in backward";
      }
      if (!speculated) {
        EXPECT_GT(seq(u, "step_begin"), norm_seq) << "unit " << u;
        continue;
      }
      ++(*speculated_units);
      EXPECT_TRUE(speculative) << "unit " << u;
      EXPECT_EQ(seq(u, "step_begin"), -1) << "unit " << u << ": stepped once";
      EXPECT_GT(seq(u, "speculate_begin"), seq(u, "speculate_queued")) << "unit " << u;
      EXPECT_LT(seq(u, "speculate_end"), updated) << "unit " << u;
      EXPECT_NE(seq(u, "adopt") >= 0, seq(u, "restep_begin") >= 0) << "unit " << u << ": adopted or stepped again";
    }
    ASSERT_FALSE(stepped_order[step].empty());
    if (!speculative || seq(units - 1, "speculate_begin") < 0)  // (no speculation: the optimizer's order)
      EXPECT_EQ(stepped_order[step].front(), 0) << "the embedding first: the next forward reads it first";
    else
      EXPECT_EQ(stepped_order[step].front(), units - 1) << "the head's gradient lands first in backward";
  }
}

TEST(OffloadSchedule, RecordedEventsFollowEachModesOrder) {
  const ScheduleCase c{"adamw_2ranks", 2, testing::micro_case("adamw").flags};
  const std::string clipping = clipping_between_norms(c);
  const testing::RecordedRun& host = micro_run(c, clipping + " --offload optimizer --offload_trace");
  const testing::RecordedRun& speculative = micro_run(c, clipping + speculative_flags(c));
  ASSERT_EQ(host.exit_code, 0) << host.output;
  ASSERT_EQ(speculative.exit_code, 0) << speculative.output;
  const testing::RecordedRun& lagging = testing::recorded_run(
      c.ranks, testing::micro_run_flags(c.ranks, c.flags + clipping + speculative_flags(c)), "LLM_DEBUG_OFFLOAD_LAG_MS=10");
  ASSERT_EQ(lagging.exit_code, 0) << lagging.output;
  testing::expect_same_run(host.dir, lagging.dir, testing::kMicroSteps);
  const testing::RecordedRun& device = micro_run(c, clipping + " --offload optimizer --offload_step device --offload_trace");
  ASSERT_EQ(device.exit_code, 0) << device.output;
  const int units = 4;  // llama_micro: embed, layer.0, layer.1, head
  for (int r = 0; r < c.ranks; ++r) {
    const std::vector<json> host_events = read_trace(host.run_dir(), r), speculative_events = read_trace(speculative.run_dir(), r);
    ASSERT_FALSE(host_events.empty()) << "rank " << r;
    int speculated = 0;
    expect_schedule(host_events, false, units, "host, rank " + std::to_string(r), &speculated);
    EXPECT_EQ(speculated, 0);
    expect_schedule(speculative_events, true, units, "speculative, rank " + std::to_string(r), &speculated);
    EXPECT_GT(speculated, 0) << "rank " << r << ": some unit is stepped in backward";
    // A worker that lags (10 ms before each task) has begun the head's step when the norm comes,
    // and not the others': those are stepped after the norm, as without speculation.
    int lagging_speculated = 0;
    const std::vector<json> lagging_events = read_trace(lagging.run_dir(), r);
    expect_schedule(lagging_events, true, units, "lagging, rank " + std::to_string(r), &lagging_speculated);
    EXPECT_GT(lagging_speculated, 0) << "rank " << r;
    EXPECT_LT(lagging_speculated, units * testing::kMicroSteps) << "rank " << r << ": some step is left to the norm";
    for (const json& event : host_events)
      EXPECT_FALSE(std::string(event.at("what")).starts_with("speculate")) << "host mode speculates nothing";
    // The device step: the main thread steps every unit after the norm, the embedding first.
    int device_speculated = 0;
    const std::vector<json> device_events = read_trace(device.run_dir(), r);
    expect_schedule(device_events, false, units, "device, rank " + std::to_string(r), &device_speculated);
    for (const json& event : device_events)
      if (event.at("what") == "step_begin") EXPECT_EQ(event.at("thread"), "main") << event.dump();
  }
}

// GaLore whole on one rank, default mode (offload/lowrank_gradients.h): a layer's crossing to the host
// (the "lowrank" event, after the norm: each matrix's low-rank gradient and projector, the norm gains
// whole) is under half the layer's full gradient shard, which AdamW's run sends whole ("gradient"
// events of the same model); the embedding and head, which have no GaLore matrix, send theirs whole.
// Bitwise equal to no offload: Cases/OffloadEquivalence galore_1rank, and the speculative twins.
TEST(OffloadSchedule, GaLoreSendsOnlyTheLowRankGradient) {
  const ScheduleCase galore{"galore_1rank", 1, testing::micro_case("galore_right").flags};
  const ScheduleCase adamw{"adamw_1rank", 1, testing::micro_case("adamw").flags};
  const testing::RecordedRun& projected = micro_run(galore, " --offload optimizer --offload_trace");
  const testing::RecordedRun& whole = micro_run(adamw, " --offload optimizer --offload_trace");
  ASSERT_EQ(projected.exit_code, 0) << projected.output;
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  std::map<int64_t, int64_t> full;  // unit -> its gradient shard's bytes
  for (const json& event : read_trace(whole.run_dir(), 0))
    if (event.at("what") == "gradient") full[event.at("unit")] = event.at("bytes");
  ASSERT_EQ(full.size(), 4u);
  std::map<int64_t, int> lowrank_steps;
  for (const json& event : read_trace(projected.run_dir(), 0)) {
    const int64_t unit = event.value("unit", int64_t{-1});
    if (event.at("what") == "lowrank") {
      ++lowrank_steps[unit];
      EXPECT_LT(2 * event.at("bytes").get<int64_t>(), full.at(unit)) << event.dump();
      EXPECT_GT(event.at("bytes").get<int64_t>(), 0) << event.dump();
    }
    if (event.at("what") == "gradient" && event.contains("bytes")) {
      EXPECT_EQ(event.at("bytes").get<int64_t>(), full.at(unit)) << "a unit without GaLore sends its gradient whole";
      EXPECT_TRUE(unit == 0 || unit == 3) << event.dump();
    }
  }
  EXPECT_EQ(lowrank_steps, (std::map<int64_t, int>{{1, testing::kMicroSteps}, {2, testing::kMicroSteps}}))
      << "each layer, every step";
}

// GaLore projected on the device equals GaLore without offload, bit for bit, for each projector
// (right, left, subspace), strategy and world size and precision, with clipping firing on some
// steps; and resumed from its step-3 checkpoint (whose projectors, refreshed at step 1, the device
// copies take from the loaded state), the uninterrupted run's bits.
class GaLoreOnDevice : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(GaLoreOnDevice, EqualsGaLoreWithoutOffloadBitwiseAndResumes) {
  const ScheduleCase& c = GetParam();
  const std::string clipping = clipping_between_norms(c);
  const testing::RecordedRun& plain = micro_run(c, clipping);
  const testing::RecordedRun& offloaded = micro_run(c, clipping + " --offload optimizer --offload_trace");
  ASSERT_EQ(offloaded.exit_code, 0) << offloaded.output;
  testing::expect_same_run(plain.dir, offloaded.dir, testing::kMicroSteps);
  testing::expect_clips_on_some_steps(grad_norms(plain), threshold_of(clipping));
  int lowrank = 0;
  for (const json& event : read_trace(offloaded.run_dir(), 0)) lowrank += event.at("what") == "lowrank";
  EXPECT_GT(lowrank, 0) << "the low-rank path ran";
  testing::ScratchDir dir("galore_on_device_resume");
  resume_micro_run(c.ranks, c.flags + clipping + " --offload optimizer",
                   (offloaded.save_dir() / ("step_" + std::to_string(testing::kMicroSaveAt))).string(), dir);
  const std::vector<double> whole = losses(plain.run_dir()), rest = losses(dir / "run");
  ASSERT_EQ(rest.size(), static_cast<size_t>(testing::kMicroSteps - testing::kMicroSaveAt));
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], whole[testing::kMicroSaveAt + i]) << "step " << i + 4;
  expect_same_checkpoint(plain.save_dir() / kLastStep, dir / "ckpt" / kLastStep);
}

const ScheduleCase kGaLoreCases[] = {
    {"right_1rank", 1, testing::micro_case("galore_right").flags},
    {"left_1rank", 1, testing::micro_case("galore_left").flags},
    {"subspace_1rank", 1, testing::micro_case("galore_subspace").flags},
    {"right_no_shard_2ranks", 2, testing::micro_case("galore_right").flags + " --sharding no_shard"},
    // Sharded: the refresh gathers the matrix's gradient, a left projection sums across ranks, on the
    // device's communicator; a left projection's update is gathered back on the host's.
    {"right_4ranks", 4, testing::micro_case("galore_right").flags},
    {"left_shard_grad_op_3ranks", 3, testing::micro_case("galore_left").flags + " --sharding shard_grad_op"},
    {"subspace_2ranks", 2, testing::micro_case("galore_subspace").flags},
    {"left_bf16_state_pure_1rank", 1,
     testing::micro_case("galore_left").flags + " --optimizer_state_dtype bfloat16 --dtype bfloat16 --precision pure"},
};

INSTANTIATE_TEST_SUITE_P(Cases, GaLoreOnDevice, ::testing::ValuesIn(kGaLoreCases),
                         [](const auto& info) { return info.param.name; });

// The flags' refusals: a mode of --offload optimizer, not with the delayed update; a trace of it.
TEST(OffloadSchedule, TheFlagsNeedOptimizerOffload) {
  const std::string base = testing::trainer_binary().string() + " --config " +
                           (testing::source_dir() / "configs/llama_micro.json").string() +
                           " --device cpu --num_training_steps 1 --max_length 32 --print_config";
  for (const std::string& flags : {" --offload_step speculative", " --offload parameters --offload_step speculative",
                                   " --offload_trace",
                                   " --offload optimizer --offload_step speculative --offload_delayed_update 2",
                                   " --offload optimizer --offload_step sideways",
                                   " --offload optimizer,parameters --offload_step device",
                                   " --offload optimizer --offload_step device --offload_delayed_update 1"}) {
    const auto refused = testing::run_command(base + flags);
    EXPECT_EQ(refused.exit_code, 2) << flags << "\n" << refused.output;
    EXPECT_NE(refused.output.find(flags.find("trace") != std::string::npos ? "--offload_trace" : "--offload_step"),
              std::string::npos) << refused.output;
  }
  EXPECT_EQ(testing::run_command(base + " --offload optimizer --offload_step speculative --offload_trace").exit_code, 0);
  // Sharded AdamwSN steps with a sum across ranks, which the device step does not make.
  const std::string estimate = testing::trainer_binary().string() + " estimate --config " +
                               (testing::source_dir() / "configs/llama_micro.json").string() +
                               " --max_length 32 --offload optimizer --offload_step device --optimizer adamw_sn";
  const auto sharded = testing::run_command(estimate + " --world_size 2");
  EXPECT_EQ(sharded.exit_code, 2) << sharded.output;
  EXPECT_NE(sharded.output.find("--offload_step: device steps each unit on its own"), std::string::npos) << sharded.output;
  EXPECT_EQ(testing::run_command(estimate + " --world_size 2 --sharding no_shard").exit_code, 0);
}

}  // namespace
}  // namespace llm::offload_schedule_test
