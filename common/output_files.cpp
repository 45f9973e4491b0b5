#include "common/output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include "common/log.h"

namespace llm {
namespace fs = std::filesystem;

std::string describe_path_kind(const fs::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int failure = errno;
    struct stat link {};
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      return failure == ELOOP ? "a loop of symbolic links" : "a symbolic link to nothing";
    return "";
  }
  if (S_ISREG(info.st_mode)) return "a regular file";
  if (S_ISDIR(info.st_mode)) return "a folder";
  if (S_ISCHR(info.st_mode)) return "a character device";
  if (S_ISBLK(info.st_mode)) return "a block device";
  if (S_ISFIFO(info.st_mode)) return "a fifo";
  if (S_ISSOCK(info.st_mode)) return "a socket";
  return "something else";
}

void refuse_unless_absent_or(const fs::path& path, OutputKind kind, const std::string& what) {
  const std::string found = describe_path_kind(path);
  const std::string wanted = kind == OutputKind::file ? "a regular file" : "a folder";
  if (found.empty() || found == wanted) return;
  throw UserError(what + ": " + path.string() + " exists and is " + found + ", not " + wanted +
                  "; it is never replaced: choose another path");
}

WriteError::WriteError(const fs::path& path, const std::string& reason)
    : UserError("cannot write " + path.string() + ": " + reason +
                " (disk full, over quota or not writable?)"),
      path_(path),
      reason_(reason) {}

namespace {
std::atomic<WriteFailurePolicy> policy{WriteFailurePolicy::stop};
}

void set_write_failure_policy(WriteFailurePolicy value) { policy.store(value); }
WriteFailurePolicy write_failure_policy() { return policy.load(); }

namespace {
std::mutex pending_mutex;
bool deferring = false;
std::unique_ptr<WriteError> pending;
}  // namespace

void defer_write_failures(bool deferred) {
  std::lock_guard<std::mutex> lock(pending_mutex);
  deferring = deferred;
}

std::unique_ptr<WriteError> take_pending_write_failure() {
  std::lock_guard<std::mutex> lock(pending_mutex);
  return std::move(pending);
}

bool write_failure_pending() {
  std::lock_guard<std::mutex> lock(pending_mutex);
  return pending != nullptr;
}

void run_file_write_failed(const fs::path& path, const std::string& reason) {
  if (write_failure_policy() == WriteFailurePolicy::stop) {
    std::lock_guard<std::mutex> lock(pending_mutex);
    if (!deferring) throw WriteError(path, reason);
    if (pending == nullptr) pending = std::make_unique<WriteError>(path, reason);
    return;
  }
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned.insert(path.string()).second) return;
  log::warn("cannot write {}: {}; going on without it (--on_write_error warn): this file is incomplete "
            "from here", path.string(), reason);
}

void write_file_atomically(const fs::path& path, std::string_view text) {
  refuse_unless_absent_or(path, OutputKind::file, "output file");
  const fs::path staging = path.string() + ".tmp";
  const int descriptor = ::open(staging.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (descriptor < 0) throw WriteError(path, std::strerror(errno));
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(descriptor, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error_number = n < 0 ? errno : ENOSPC;
      ::close(descriptor);
      ::unlink(staging.c_str());
      throw WriteError(path, std::strerror(error_number));
    }
    written += static_cast<size_t>(n);
  }
  const int synced = ::fsync(descriptor) == 0 ? 0 : errno;
  const int closed = ::close(descriptor) == 0 ? 0 : errno;
  if (synced != 0 || closed != 0) {
    const int error_number = synced != 0 ? synced : closed;
    ::unlink(staging.c_str());
    throw WriteError(path, std::strerror(error_number));
  }
  if (::rename(staging.c_str(), path.c_str()) != 0) {
    const int error_number = errno;
    ::unlink(staging.c_str());
    throw WriteError(path, std::strerror(error_number));
  }
}

std::error_code create_folders_durably(const fs::path& path) {
  std::error_code error;
  fs::path existing = fs::absolute(path, error);
  if (error) return error;
  const fs::path wanted = existing;
  while (!fs::exists(existing, error) && existing.has_parent_path() && existing.parent_path() != existing)
    existing = existing.parent_path();
  fs::create_directories(wanted, error);
  if (error) return error;
  for (fs::path created = wanted; created != existing && created.has_parent_path() && created.parent_path() != created;
       created = created.parent_path()) {
    const int descriptor = ::open(created.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (descriptor < 0) return {errno, std::generic_category()};
    const int synced = ::fsync(descriptor) == 0 || errno == EINVAL ? 0 : errno;  // EINVAL: cannot sync folders
    ::close(descriptor);
    if (synced != 0) return {synced, std::generic_category()};
  }
  return {};
}

RunFile::~RunFile() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

void RunFile::open(const fs::path& path, bool append) {
  refuse_unless_absent_or(path, OutputKind::file, "run file");
  path_ = path;
  descriptor_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (descriptor_ < 0) throw WriteError(path, std::strerror(errno));
  struct stat info {};
  if (::fstat(descriptor_, &info) != 0) throw WriteError(path, std::strerror(errno));
  size_ = info.st_size;
}

void RunFile::write_line(std::string_view line) {
  std::string text(line);
  text += '\n';
  write_record(text);
}

void RunFile::write_record(std::string_view text) {
  if (descriptor_ < 0 || failed_) return;
  size_t written = 0;
  int error_number = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(descriptor_, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_number = n < 0 ? errno : ENOSPC;
      break;
    }
    written += static_cast<size_t>(n);
  }
  if (error_number == 0) {
    size_ += static_cast<off_t>(written);
    return;
  }
  // Part of the record may be in: cut it off, so the file ends with the last whole one.
  const int cut = ::ftruncate(descriptor_, size_);
  (void)cut;  // a file that cannot be cut back ends mid-line; the message below is what matters
  failed_ = true;
  run_file_write_failed(path_, std::strerror(error_number));
}

void RunFile::close() {
  if (descriptor_ < 0) return;
  const int synced = ::fsync(descriptor_) == 0 || errno == EINVAL ? 0 : errno;
  const int closed = ::close(descriptor_) == 0 ? 0 : errno;
  descriptor_ = -1;
  if (!failed_ && (synced != 0 || closed != 0)) {
    failed_ = true;
    run_file_write_failed(path_, std::strerror(synced != 0 ? synced : closed));
  }
}

}  // namespace llm
