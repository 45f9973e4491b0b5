#include "common/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "common/errors.h"
#include "common/output_files.h"

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

std::string article(const std::string& noun) { return (noun.starts_with("o") ? "an " : "a ") + noun; }

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
  take(folder / kFileName, what + " " + folder.string(), "folder");
}

FolderLock::FolderLock(const fs::path& lock_file, const fs::path& named, const std::string& what,
                       bool remove_when_released)
    : folder_(named), remove_when_released_(remove_when_released) {
  take(lock_file, what + " " + named.string(), "output");
}

std::unique_ptr<FolderLock> FolderLock::output(const fs::path& output, const std::string& what) {
  refuse_inside_checkpoint(output, what);
  const fs::path absolute = fs::absolute(output).lexically_normal();
  const fs::path parent = absolute.has_filename() ? absolute.parent_path() : absolute.parent_path().parent_path();
  const std::string name = (absolute.has_filename() ? absolute : absolute.parent_path()).filename().string();
  // The output's folders are created (export's --to "runs/a/b" where runs/a is new): the lock sits in
  // the parent, so it must exist first.
  if (const std::error_code error = create_folders_durably(parent))
    throw UserError(what + " " + output.string() + ": cannot create its folder " + parent.string() + " (" +
                    error.message() + ")");
  return std::unique_ptr<FolderLock>(
      new FolderLock(parent / ("." + name + ".trainer.lock"), output, what, /*remove_when_released=*/true));
}

void FolderLock::take(const fs::path& path, const std::string& subject, const std::string& noun) {
  lock_file_ = path;
  // An output's lock file is removed on release: another process may have opened the old file just
  // before, and would then lock an unlinked inode while a third creates a new one. So after locking,
  // the path must still name the locked file; else open it again.
  for (int attempt = 0;; ++attempt) {
    descriptor_ = open_output_file(path, O_RDWR, subject + "'s lock");
    if (descriptor_ < 0)
      throw UserError(subject + ": cannot open its lock file " + path.string() + " (" + std::strerror(errno) +
                      "); pass " + article(noun) + " you can write");
    if (::flock(descriptor_, LOCK_EX | LOCK_NB) != 0) {
      const int error_number = errno;
      const std::string holder = read_holder(descriptor_);
      ::close(descriptor_);
      descriptor_ = -1;
      if (error_number == EWOULDBLOCK)
        throw UserError(subject + " is in use by another job (" +
                        (holder.empty() ? std::string("its holder has not written its name yet") : holder) +
                        "): two jobs on one " + noun + " would interleave or replace each other's files. Wait for it "
                        "to end, stop it, or pass another " + noun);
      throw UserError(subject + ": cannot lock " + path.string() + " (" + std::strerror(error_number) +
                      "): the file system does not support locks (Lustre: mount with -o flock); pass " + article(noun) +
                      " on one that does");
    }
    struct stat locked {}, named {};
    if (!remove_when_released_ || attempt >= 8 ||
        (::fstat(descriptor_, &locked) == 0 && ::stat(path.c_str(), &named) == 0 && locked.st_ino == named.st_ino &&
         locked.st_dev == named.st_dev))
      break;
    ::close(descriptor_);  // the file was removed and maybe replaced since we opened it: again
    descriptor_ = -1;
  }
  // Ours now: say who holds it, for the message a second job gets.
  const std::string holder = this_holder() + "\n";
  if (::ftruncate(descriptor_, 0) == 0) {
    const ssize_t ignored = ::pwrite(descriptor_, holder.data(), holder.size(), 0);
    (void)ignored;  // the lock holds without its note
  }
}

FolderLock::~FolderLock() {
  if (descriptor_ < 0) return;
  if (remove_when_released_) ::unlink(lock_file_.c_str());  // while still held: see take()
  ::close(descriptor_);
}

}  // namespace llm
