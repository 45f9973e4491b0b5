// Helpers shared by the tests: paths into the source tree, scratch folders, running the binary.
#pragma once

#include <sys/types.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llm::testing {

// The paths this build was made with, or where TRAINER_TEST_SOURCE_DIR, TRAINER_TEST_BINARY,
// TRAINER_TEST_MPIEXEC and TRAINER_TEST_PYTHON say (the GPU kit, launch/gpu/, runs the test binaries
// built here from another folder on another machine).
inline std::string configured(const char* variable, const char* built_with) {
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0' ? value : built_with;
}
inline std::filesystem::path source_dir() { return configured("TRAINER_TEST_SOURCE_DIR", TRAINER_SOURCE_DIR); }
inline std::filesystem::path trainer_binary() { return configured("TRAINER_TEST_BINARY", TRAINER_BINARY); }
inline std::string mpiexec() { return configured("TRAINER_TEST_MPIEXEC", TRAINER_MPIEXEC); }
#ifdef TRAINER_PYTHON
inline std::filesystem::path python() { return configured("TRAINER_TEST_PYTHON", TRAINER_PYTHON); }
#endif
// mpirun with the settings every multi-rank test needs here (root, 2 cores, up to 4 ranks), and
// Open MPI's ob1 message layer named: otherwise each rank probes the others first, and the Omni-Path
// library's start (libpsm2) alone sleeps 0.1 s a CPU to calibrate a timer. ob1 (shared memory, TCP) is
// what the probe ends up choosing on a machine without such hardware.
inline std::string mpirun(int ranks) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMPI_MCA_pml=ob1 " +
         mpiexec() + " --oversubscribe -np " + std::to_string(ranks) + " ";
}

// A fresh, empty folder under the system temp dir, removed when the object dies.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() /
            ("trainer_test_" + tag + "_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter()++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  static int& counter() {
    static int value = 0;
    return value;
  }
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = 0;
  std::string output;  // stdout and stderr together
};

// Runs a shell command, capturing its output. A command that ends with exit status 2 (bad input) or
// 3 (diverged) is also recorded as an error case (record_error_case).
CommandResult run_command(const std::string& command);

// With TRAINER_ERROR_CASES=FILE in the environment, appends one JSON line to FILE: the running test,
// the input (a command line, with this build's paths shortened), the exit status and the message
// (the output's "error:" line, else its last line). launch/errors_table.sh runs the tests so and
// writes docs/errors.md from the lines. Without the variable: nothing.
void record_error_case(const std::string& input, int exit_code, const std::string& output);

// A file's bytes ("" when it cannot be read).
std::string read_text(const std::filesystem::path& path);

// The process of a running command (its --run_dir names it among concurrent tests) whose argv[0] is
// `program`; with `rank` >= 0, the one whose OMPI_COMM_WORLD_RANK is that rank (a lone process is
// rank 0). -1 when none.
pid_t find_process(const std::string& program, const std::filesystem::path& run_dir, int rank);

// Starts `command`, waits (up to 120 s) until RUN_DIR/metrics.jsonl holds `after_steps` train
// records, then calls `act` until it returns true (it may be called again while it returns false);
// returns the command's result. A run that ended first, or an action never taken, is said at the top
// of the output.
CommandResult run_and_act(const std::string& command, const std::filesystem::path& run_dir,
                          const std::function<bool()>& act, size_t after_steps = 1);

// The records of RUN_DIR/metrics.jsonl whose "event" is `event`, in file order.
std::vector<nlohmann::json> read_metrics_events(const std::filesystem::path& run_dir,
                                                const std::string& event);

// The records of RUN_DIR/memory.rank<R>.jsonl (the ledger) whose "event" is `event`, in file order.
std::vector<nlohmann::json> read_ledger_events(const std::filesystem::path& run_dir, int rank,
                                               const std::string& event);

// `trainer estimate --json`'s ranks, one entry per rank: the estimate prints consecutive ranks that are
// alike once, as [rank, last_rank] (memory/estimate.h: ranks_alike); each entry here has its own rank.
inline nlohmann::json estimate_per_rank(const nlohmann::json& estimate) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const nlohmann::json& kind : estimate.at("ranks"))
    for (int rank = kind.at("rank").get<int>(); rank <= kind.at("last_rank").get<int>(); ++rank) {
      ranks.push_back(kind);
      ranks.back()["rank"] = rank;
      ranks.back().erase("last_rank");
    }
  return ranks;
}

// A parameterised test's name in ctest's list from its text parameter: letters and digits kept, any
// other character '_' ("building the model" -> "building_the_model"). Use as the name generator of
// INSTANTIATE_TEST_SUITE_P, so the list says what each instance runs rather than /0, /1.
struct TextParamName {
  template <class Info>
  std::string operator()(const Info& info) const {
    std::string name = info.param;
    for (char& c : name)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return name;
  }
};

}  // namespace llm::testing
