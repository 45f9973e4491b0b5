#include "common/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "common/errors.h"

namespace llm {
namespace fs = std::filesystem;

namespace {

std::string read_holder(int descriptor) {
  char text[512] = {};
  const ssize_t n = ::pread(descriptor, text, sizeof(text) - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
  return holder;
}

std::string this_holder() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char when[64] = {};
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  return "host " + std::string(host) + ", process " + std::to_string(::getpid()) + ", since " + when;
}

}  // namespace

FolderLock::FolderLock(const fs::path& folder, const std::string& what) : folder_(folder) {
  const fs::path path = folder / kFileName;
  descriptor_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (descriptor_ < 0)
    throw UserError(what + " " + folder.string() + ": cannot open its lock file " + path.string() + " (" +
                    std::strerror(errno) + "); pass a folder you can write");
  if (::flock(descriptor_, LOCK_EX | LOCK_NB) != 0) {
    const int error_number = errno;
    const std::string holder = read_holder(descriptor_);
    ::close(descriptor_);
    descriptor_ = -1;
    if (error_number == EWOULDBLOCK)
      throw UserError(what + " " + folder.string() + " is in use by another job (" +
                      (holder.empty() ? std::string("its holder has not written its name yet") : holder) +
                      "): two jobs on one folder would interleave or replace each other's files. Wait for it to "
                      "end, stop it, or pass another folder");
    throw UserError(what + " " + folder.string() + ": cannot lock " + path.string() + " (" +
                    std::strerror(error_number) +
                    "): the file system does not support locks (Lustre: mount with -o flock); pass a folder on "
                    "one that does");
  }
  // Ours now: say who holds it, for the message a second job gets.
  const std::string holder = this_holder() + "\n";
  if (::ftruncate(descriptor_, 0) == 0) {
    const ssize_t ignored = ::pwrite(descriptor_, holder.data(), holder.size(), 0);
    (void)ignored;  // the lock holds without its note
  }
}

FolderLock::~FolderLock() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

}  // namespace llm
