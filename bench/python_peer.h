// A Python process that answers a bench's commands: one JSON object per line each way, over the
// child's stdin and stdout (bench/adamw_peers.py --serve). Running the peer as a server rather than
// once per size lets the bench interleave one step of each side with its own, so load from other
// processes falls on every side alike.
//
// Header-only because every .cpp in bench/ is a program of its own (bench/CMakeLists.txt).
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace bench {

class PythonPeer {
 public:
  // Starts `python script args...` with `environment` added to ours. started() is false (and
  // why() says why) when the process could not start or sent no greeting.
  PythonPeer(const std::string& python, const std::vector<std::string>& arguments,
             const std::vector<std::pair<std::string, std::string>>& environment) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) {
      why_ = "pipe() failed";
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) close(fd);
      for (const auto& [name, value] : environment) setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> argv = {const_cast<char*>(python.c_str())};
      for (const std::string& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
      argv.push_back(nullptr);
      execv(python.c_str(), argv.data());
      std::fprintf(stderr, "cannot run %s\n", python.c_str());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    if (pid_ < 0) {
      why_ = "fork() failed";
      return;
    }
    to_ = fdopen(to_child[1], "w");
    from_ = fdopen(from_child[0], "r");
    greeting_ = read_line();
    if (greeting_.is_null()) why_ = python + " " + (arguments.empty() ? "" : arguments[0]) +
                                    " exited without answering (see its messages above)";
  }

  ~PythonPeer() {
    if (to_ != nullptr) {
      std::fputs("{\"cmd\": \"quit\"}\n", to_);
      std::fclose(to_);
    }
    if (from_ != nullptr) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  PythonPeer(const PythonPeer&) = delete;
  PythonPeer& operator=(const PythonPeer&) = delete;

  bool started() const { return !greeting_.is_null(); }
  const std::string& why() const { return why_; }
  const nlohmann::json& greeting() const { return greeting_; }

  // Sends one command and returns the answer; throws std::runtime_error when the peer is gone or
  // answers {"error": ...}.
  nlohmann::json ask(const nlohmann::json& command) {
    if (!started()) throw std::runtime_error("the Python peer is not running: " + why_);
    const std::string line = command.dump() + "\n";
    if (std::fputs(line.c_str(), to_) < 0 || std::fflush(to_) != 0)
      throw std::runtime_error("the Python peer closed its input");
    nlohmann::json answer = read_line();
    if (answer.is_null()) throw std::runtime_error("the Python peer exited (see its messages above)");
    if (answer.contains("error"))
      throw std::runtime_error("the Python peer failed on " + command.dump().substr(0, 200) + ": " +
                               answer["error"].get<std::string>());
    return answer;
  }

 private:
  nlohmann::json read_line() {
    std::string line;
    for (int c; (c = std::fgetc(from_)) != EOF && c != '\n';) line.push_back(static_cast<char>(c));
    if (line.empty()) return nullptr;
    return nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  }

  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  nlohmann::json greeting_;
  std::string why_;
};

}  // namespace bench
