#include "tests/test_util.h"

#include <array>
#include <cstdio>
#include <fstream>
#include <sys/wait.h>

namespace llm::testing {

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {127, "popen failed"};
  std::array<char, 4096> buffer;
  size_t read = 0;
  while ((read = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), read);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::vector<nlohmann::json> read_metrics_events(const std::filesystem::path& run_dir,
                                                const std::string& event) {
  std::vector<nlohmann::json> records;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.at("event") == event) records.push_back(std::move(record));
  }
  return records;
}

}  // namespace llm::testing
