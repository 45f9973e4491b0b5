// `trainer estimate --profile S --profile_cache FILE` (memory/step_time.h): the first estimate measures
// the units and keeps the measurement in FILE; a later estimate of the same units (another sharding,
// another offload mode) takes it from there and prices its compute with the same numbers, so the rows
// of launch/step_time_table.sh differ only by what the model says differs; other units (another
// micro-batch) are measured and added. Every bad use is exit 2 naming the flag.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace llm::step_time_profile_cache_test {
namespace {

using testing::ScratchDir;

std::string estimate(const std::string& flags) {
  return testing::trainer_binary().string() + " estimate --config " +
         (testing::source_dir() / "configs/llama_micro.json").string() + " --device cpu --max_length 32 " + flags;
}

nlohmann::json step_time(const testing::CommandResult& result) {
  return nlohmann::json::parse(result.output.substr(result.output.find('{'))).at("step_time");
}

TEST(ProfileCache, ALaterEstimateOfTheSameUnitsPricesThemWithTheKeptProfile) {
  const ScratchDir scratch("profile_cache");
  const std::string cache = (scratch / "profile.json").string();
  const std::string kept = " --profile 0.2 --profile_cache " + cache + " --json";
  const testing::CommandResult first = testing::run_command(estimate("--batch_size 2 --world_size 2" + kept));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("timing the units"), std::string::npos) << first.output;
  nlohmann::json file = nlohmann::json::parse(testing::read_text(cache));
  ASSERT_EQ(file.at("entries").size(), 1u) << file.dump(2);

  // Another sharding and offload mode over the same units: no profile, the same compute, phase by phase.
  const testing::CommandResult second =
      testing::run_command(estimate("--batch_size 2 --world_size 2 --sharding no_shard --offload optimizer" + kept));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(second.output.find("timing the units"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("as profiled before"), std::string::npos) << second.output;
  const nlohmann::json a = step_time(first), b = step_time(second);
  EXPECT_EQ(a.at("phase_s").at("forward"), b.at("phase_s").at("forward"));
  EXPECT_EQ(a.at("phase_s").at("backward"), b.at("phase_s").at("backward"));
  EXPECT_NE(b.at("compute_source").get<std::string>().find("kept in " + cache), std::string::npos) << b.dump(2);

  // Other units (another micro-batch) are measured and added beside the first.
  const testing::CommandResult third = testing::run_command(estimate("--batch_size 1 --world_size 2" + kept));
  ASSERT_EQ(third.exit_code, 0) << third.output;
  EXPECT_NE(third.output.find("timing the units"), std::string::npos) << third.output;
  file = nlohmann::json::parse(testing::read_text(cache));
  EXPECT_EQ(file.at("entries").size(), 2u) << file.dump(2);
}

TEST(ProfileCache, EveryBadUseIsExitTwoNamingTheFlag) {
  const ScratchDir scratch("profile_cache_bad");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(scratch / name) << text;
    return (scratch / name).string();
  };
  // The key of this machine's estimate (its threads among it) is taken from a good run's file, and
  // that file broken entry by entry.
  const std::string good = (scratch / "good.json").string();
  ASSERT_EQ(testing::run_command(estimate("--batch_size 2 --profile 0.2 --profile_cache " + good)).exit_code, 0);
  nlohmann::json broken = nlohmann::json::parse(testing::read_text(good));
  for (auto& [key, value] : broken.at("entries").items()) value.erase("head");
  nlohmann::json negative = nlohmann::json::parse(testing::read_text(good));
  for (auto& [key, value] : negative.at("entries").items()) value["copy_seconds_per_byte"] = -1.0;
  const std::string fifo = (scratch / "fifo.json").string();  // read, it would block the estimate
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const struct {
    std::string flags, says;
  } cases[] = {
      {"--profile_cache " + good, "has no --profile"},
      {"--profile 0.2 --device_tflops 1 --profile_cache ''", "names no file"},
      {"--profile 0.2 --profile_cache " + write("text.json", "not json"), "is not JSON"},
      {"--profile 0.2 --profile_cache " + write("array.json", "[1, 2]"), "is not a profile cache"},
      {"--profile 0.2 --profile_cache " + fifo, "is a fifo, not a regular file"},
      {"--profile 0.2 --profile_cache " + write("broken.json", broken.dump()), "is not a profile"},
      {"--profile 0.2 --profile_cache " + write("negative.json", negative.dump()), "negative or not finite"},
      {"--profile 0.2 --profile_cache " + (scratch / "no_such_folder" / "profile.json").string(), "cannot be written"},
  };
  for (const auto& bad : cases) {
    const testing::CommandResult result = testing::run_command(estimate("--batch_size 2 " + bad.flags));
    EXPECT_EQ(result.exit_code, 2) << bad.flags << "\n" << result.output;
    EXPECT_NE(result.output.find("--profile_cache"), std::string::npos) << bad.flags << "\n" << result.output;
    EXPECT_NE(result.output.find(bad.says), std::string::npos) << bad.flags << "\n" << result.output;
  }
}

}  // namespace
}  // namespace llm::step_time_profile_cache_test
