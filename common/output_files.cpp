#include "common/output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
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

namespace {
bool is_step_folder_name(std::string name) {
  if (name.ends_with(".tmp")) name.resize(name.size() - 4);
  return name.size() > 5 && name.starts_with("step_") &&
         std::all_of(name.begin() + 5, name.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}
}  // namespace

fs::path checkpoint_folder_holding(const fs::path& path, const fs::path& save_dir) {
  std::error_code error;
  const fs::path saves = save_dir.empty() ? fs::path() : fs::weakly_canonical(fs::absolute(save_dir), error);
  for (fs::path at = fs::weakly_canonical(fs::absolute(path), error); at.has_relative_path(); at = at.parent_path()) {
    if (!is_step_folder_name(at.filename().string())) continue;
    if ((!saves.empty() && at.parent_path() == saves) || fs::is_regular_file(at / "manifest.json", error)) return at;
  }
  return {};
}

void refuse_inside_checkpoint(const fs::path& path, const std::string& what, const fs::path& save_dir) {
  const fs::path folder = checkpoint_folder_holding(path, save_dir);
  if (folder.empty()) return;
  std::error_code error;
  const bool in_save_dir =
      !save_dir.empty() && folder.parent_path() == fs::weakly_canonical(fs::absolute(save_dir), error);
  fail_user(kCommandLine, what,
            "\"" + path.string() + "\" is inside the checkpoint folder " + folder.string() +
                (in_save_dir ? " of --save_dir" : "") +
                ": a checkpoint holds only what a save writes (a save of that step would not replace it, "
                "--keep_last or a resume that saves that step again would remove it without a word); pass a path "
                "outside the step_<N> folders");
}

int open_output_file(const fs::path& path, int flags, const std::string& what) {
  const int descriptor = ::open(path.c_str(), flags | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (descriptor >= 0) return descriptor;
  const int error_number = errno;
  struct stat link {};
  if ((error_number == ELOOP || error_number == EEXIST) && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    std::error_code unreadable;
    const fs::path target = fs::read_symlink(path, unreadable);
    throw UserError(what + ": " + path.string() + " is a symbolic link" +
                    (unreadable ? std::string() : " (to " + target.string() + ")") +
                    ", which the trainer never writes through (it would overwrite the file it points to); "
                    "remove the link, or choose another folder");
  }
  errno = error_number;
  return -1;
}

std::FILE* open_output_stream(const fs::path& path, const std::string& what) {
  const int descriptor = open_output_file(path, O_WRONLY | O_TRUNC, what);
  if (descriptor < 0) return nullptr;
  std::FILE* stream = ::fdopen(descriptor, "wb");
  if (stream == nullptr) {
    const int error_number = errno;
    ::close(descriptor);
    errno = error_number;
  }
  return stream;
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

int write_fully(int descriptor, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(descriptor, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : ENOSPC;
    bytes += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

void write_file_atomically(const fs::path& path, std::string_view text, const AtomicWrite& how) {
  refuse_unless_absent_or(path, OutputKind::file, "output file");
  const fs::path staging = path.string() + how.staging_suffix;
  const int descriptor = open_output_file(staging, O_WRONLY | O_TRUNC, "output file's staging file");
  if (descriptor < 0) throw WriteError(path, std::strerror(errno));
  if (const int error_number = write_fully(descriptor, text.data(), text.size()); error_number != 0) {
    ::close(descriptor);
    ::unlink(staging.c_str());
    throw WriteError(path, std::strerror(error_number));
  }
  const int synced = !how.durable || ::fsync(descriptor) == 0 ? 0 : errno;
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
  descriptor_ = open_output_file(path, O_WRONLY | (append ? O_APPEND : O_TRUNC), "run file");
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
  const int error_number = write_fully(descriptor_, text.data(), text.size());
  if (error_number == 0) {
    size_ += static_cast<off_t>(text.size());
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
