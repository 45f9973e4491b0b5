#include "data/python_helper.h"

#include <spawn.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

extern char** environ;

namespace llm {
namespace fs = std::filesystem;

// Where the build was configured (CMakeLists.txt sets both for this file).
#ifndef TRAINER_DEFAULT_PYTHON
#define TRAINER_DEFAULT_PYTHON ""
#endif
#ifndef TRAINER_SOURCE_DIR
#define TRAINER_SOURCE_DIR ""
#endif

std::string project_python() {
  if (const char* chosen = std::getenv("TRAINER_PYTHON"); chosen != nullptr && *chosen != '\0') return chosen;
  std::error_code error;
  if (*TRAINER_DEFAULT_PYTHON != '\0' && fs::exists(TRAINER_DEFAULT_PYTHON, error)) return TRAINER_DEFAULT_PYTHON;
  return "python3";
}

std::string project_script(const std::string& relative) {
  std::error_code error;
  const fs::path built = fs::path(TRAINER_SOURCE_DIR) / relative;
  if (*TRAINER_SOURCE_DIR != '\0' && fs::exists(built, error)) return built.string();
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  for (fs::path folder = exe.parent_path(); !folder.empty() && folder != folder.root_path(); folder = folder.parent_path())
    if (fs::exists(folder / relative, error)) return (folder / relative).string();
  return built.string();
}

pid_t spawn_helper(std::vector<std::string> arguments, int in, int out, int err,
                   const std::vector<int>& close_in_child, std::string* why) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (in >= 0) posix_spawn_file_actions_adddup2(&actions, in, 0);
  if (out >= 0) posix_spawn_file_actions_adddup2(&actions, out, 1);
  if (err >= 0) posix_spawn_file_actions_adddup2(&actions, err, 2);
  for (int descriptor : close_in_child) posix_spawn_file_actions_addclose(&actions, descriptor);
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  pid_t child = -1;
  const int spawned = ::posix_spawnp(&child, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned == 0) return child;
  *why = std::strerror(spawned);
  return -1;
}

}  // namespace llm
