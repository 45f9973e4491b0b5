#include "common/input_paths.h"

#include <sys/stat.h>

#include <cerrno>

#include "common/errors.h"
#include "common/output_files.h"

namespace llm {
namespace fs = std::filesystem;

std::string plain_name_problem(const std::string& name) {
  if (name.empty()) return "is empty";
  if (name == "." || name == "..") return "is \"" + name + "\"";
  if (name.front() == '/') return "is an absolute path";
  if (name.find('/') != std::string::npos) return "holds a '/'";
  if (name.find('\0') != std::string::npos) return "holds a NUL byte";
  return "";
}

void require_plain_name(const std::string& name, const std::string& source, const std::string& key) {
  if (const std::string problem = plain_name_problem(name); !problem.empty())
    fail_user(source, key,
              "\"" + name + "\" " + problem +
                  ": not a plain file name inside the folder; the file is damaged or was not written by this trainer "
                  "(nothing outside the folder is read)");
}

std::string regular_file_problem(const fs::path& path) {
  const std::string kind = describe_path_kind(path);
  if (kind == "a regular file") return "";
  if (kind.empty()) return "is missing";
  std::error_code error;
  const bool link = fs::is_symlink(path, error);
  if (link && kind != "a symbolic link to nothing" && kind != "a loop of symbolic links") {
    const fs::path target = fs::read_symlink(path, error);
    return "is a symbolic link to " + target.string() + ", " + kind + ", not a regular file";
  }
  if (kind == "a symbolic link to nothing") {
    const fs::path target = fs::read_symlink(path, error);
    return "is a symbolic link to nothing (" + target.string() + "), not a regular file";
  }
  return "is " + kind + ", not a regular file";
}

void require_regular_file(const fs::path& path, const std::string& source, const std::string& key,
                          const std::string& why) {
  if (const std::string problem = regular_file_problem(path); !problem.empty())
    fail_user(source, key, path.string() + " " + problem + " (" + why + ")");
}

}  // namespace llm
