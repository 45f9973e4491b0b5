#include "tests/test_util.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <iterator>
#include <thread>

#include <gtest/gtest.h>

namespace llm::testing {

std::string read_text(const std::filesystem::path& path) {
  // POSIX reads, not an ifstream: a file under /proc/<pid> of a process that ends while it is read
  // fails with ESRCH, which libstdc++'s filebuf turns into an exception ("basic_filebuf::underflow
  // error reading the file: No such process"). What was read until then is returned.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text;
  std::array<char, 65536> buffer;
  for (;;) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got > 0) {
      text.append(buffer.data(), static_cast<size_t>(got));
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // end of file, or the file went away (ESRCH, ENOENT): what was read
    }
  }
  ::close(fd);
  return text;
}

namespace {

std::vector<std::string> split_nul(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t end; (end = text.find('\0', start)) != std::string::npos; start = end + 1)
    parts.push_back(text.substr(start, end - start));
  return parts;
}

}  // namespace

// Any process may end at any moment of the scan: a folder that vanishes mid-listing ends the listing
// (the caller asks again), a file that cannot be read reads as empty (that process is skipped).
pid_t find_process(const std::string& program, const std::filesystem::path& run_dir, int rank) {
  std::error_code error;
  for (std::filesystem::directory_iterator entry("/proc", error), end; !error && entry != end; entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::vector<std::string> argv = split_nul(read_text(entry->path() / "cmdline"));
    if (argv.empty() || argv[0] != program || std::find(argv.begin(), argv.end(), run_dir.string()) == argv.end())
      continue;
    if (rank >= 0) {
      int process_rank = 0;
      for (const std::string& variable : split_nul(read_text(entry->path() / "environ")))
        if (variable.rfind("OMPI_COMM_WORLD_RANK=", 0) == 0) process_rank = std::atoi(variable.c_str() + 21);
      if (process_rank != rank) continue;
    }
    return static_cast<pid_t>(std::atol(name.c_str()));
  }
  return -1;
}

CommandResult run_and_act(const std::string& command, const std::filesystem::path& run_dir,
                          const std::function<bool()>& act, size_t after_steps) {
  std::future<CommandResult> running = std::async(std::launch::async, [command] { return run_command(command); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool acted = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (running.wait_for(std::chrono::milliseconds(20)) == std::future_status::ready) break;
    // Counted in the text: a line the trainer is still writing would not parse.
    const std::string metrics = read_text(run_dir / "metrics.jsonl");
    size_t train_records = 0;
    for (size_t at = metrics.find("\"event\":\"train\""); at != std::string::npos;
         at = metrics.find("\"event\":\"train\"", at + 1))
      ++train_records;
    if (train_records < after_steps) continue;
    if ((acted = act())) break;
  }
  CommandResult result = running.get();
  if (!acted) result.output = "the test did not act (no first step, or its action never could)\n" + result.output;
  return result;
}

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
  replace_all(shown, "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMPI_MCA_pml=ob1 ", "");
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

namespace {

std::vector<nlohmann::json> read_events(const std::filesystem::path& file, const std::string& event) {
  std::vector<nlohmann::json> records;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.at("event") == event) records.push_back(std::move(record));
  }
  return records;
}

}  // namespace

std::vector<nlohmann::json> read_metrics_events(const std::filesystem::path& run_dir,
                                                const std::string& event) {
  return read_events(run_dir / "metrics.jsonl", event);
}

std::vector<nlohmann::json> read_ledger_events(const std::filesystem::path& run_dir, int rank,
                                               const std::string& event) {
  return read_events(run_dir / ("memory.rank" + std::to_string(rank) + ".jsonl"), event);
}

}  // namespace llm::testing
