#include "tests/test_util.h"

#include <array>
#include <cstdio>
#include <fstream>
#include <sys/wait.h>

#include <gtest/gtest.h>

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
  if (result.exit_code == 2 || result.exit_code == 3) record_error_case(command, result.exit_code, result.output);
  return result;
}

namespace {

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

// The message a user sees: the first "error:" line (a rank's abort may add "[rank R on HOST]"), else
// the last line of the output.
std::string message_of(const std::string& output) {
  std::string last;
  size_t start = 0;
  while (start < output.size()) {
    size_t end = output.find('\n', start);
    if (end == std::string::npos) end = output.size();
    const std::string line = output.substr(start, end - start);
    if (line.find("error: ") != std::string::npos) return line.substr(line.find("error: ") + 7);
    if (!line.empty()) last = line;
    start = end + 1;
  }
  return last;
}

}  // namespace

void record_error_case(const std::string& input, int exit_code, const std::string& output) {
  const char* file = std::getenv("TRAINER_ERROR_CASES");
  if (file == nullptr || *file == '\0') return;
  std::string shown = input;
  replace_all(shown, trainer_binary().string(), "trainer");
  replace_all(shown, mpiexec(), "mpirun");
  replace_all(shown, "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 ", "");
  replace_all(shown, "OMP_NUM_THREADS=1 ", "");
  replace_all(shown, source_dir().string() + "/", "");
  replace_all(shown, std::filesystem::temp_directory_path().string() + "/", "TMP/");
  std::string message = message_of(output);
  replace_all(message, source_dir().string() + "/", "");
  replace_all(message, std::filesystem::temp_directory_path().string() + "/", "TMP/");
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = test == nullptr ? "" : std::string(test->test_suite_name()) + "." + test->name();
  std::ofstream(file, std::ios::app) << nlohmann::json{{"test", name}, {"input", shown}, {"exit", exit_code},
                                                       {"message", message}}.dump()
                                     << "\n";
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
