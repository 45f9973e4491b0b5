// What the trainer writes, checked: every output path is of the kind expected before anything is
// written to it, and every write of a file the user keeps is checked.
//
// Why: a write-then-rename onto an existing path replaces whatever was there, so `trainer prepare
// --output /dev/full --overwrite` once replaced a device node with a regular file; and an unchecked
// stream on a full disk let a run exit 0 with metrics.jsonl cut mid-line. So an existing output path
// that is not a regular file (or not a folder, where a folder is written) is refused, naming it and
// what it is, and a failed write is an error naming the file and the system's reason, never silence.
//
// Run files (metrics.jsonl, the memory ledger, memory_report.md, ...) follow the run's policy
// (--on_write_error): `stop` (the default) ends the run with exit 2 naming the file, `warn` logs
// the failure once per file and goes on; files the user asked for by name (prepare, export, report)
// always stop.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "common/errors.h"

namespace llm {

enum class OutputKind { file, folder };

// What `path` is on disk, in words ("a regular file", "a folder", "a character device", "a fifo",
// "a socket", "a block device", "a symbolic link to nothing", "a loop of symbolic links",
// "something else"); "" when absent. common/input_paths.h says it of the files the trainer reads.
std::string describe_path_kind(const std::filesystem::path& path);

// Throws UserError unless `path` is absent or already of `kind` (following symbolic links). `what`
// names the output for the message ("--output", "--run_dir", "metrics file").
void refuse_unless_absent_or(const std::filesystem::path& path, OutputKind kind, const std::string& what);

// The checkpoint folder that holds `path` (or is it): the nearest folder above it named step_<N> or
// step_<N>.tmp (the names a save gives a checkpoint, checkpoint/checkpoint.h) that holds a
// manifest.json or sits in `save_dir`; empty when there is none.
std::filesystem::path checkpoint_folder_holding(const std::filesystem::path& path,
                                                const std::filesystem::path& save_dir = {});

// A folder or file the trainer writes (--run_dir, --tensorboard_dir, prepare's --output, export's
// --to, report's --out) inside a checkpoint folder is a UserError naming `what` and the folder: a
// checkpoint holds only what a save writes, and --keep_last, or a resume that saves that step again,
// would delete the output with it without a word (issue 51). Refused before anything is created.
void refuse_inside_checkpoint(const std::filesystem::path& path, const std::string& what,
                              const std::filesystem::path& save_dir = {});

// The one way the trainer opens a file it writes (a lock, a staging .tmp, a run file, a checkpoint's
// shard, a token file): `flags` (O_WRONLY or O_RDWR, and O_TRUNC, O_APPEND, O_EXCL as wanted) with
// O_CREAT (0644), O_CLOEXEC and O_NOFOLLOW. Why: a `.trainer.lock` that was a symbolic link to a
// user's file was followed and truncated to the lock's text; nothing the trainer creates may follow a
// link that an attacker or an accident left under its name. A link there (to anything, or to nothing)
// is a UserError naming `what`, the path and where it points, never followed and never removed (it is
// not ours). Returns the descriptor, or -1 with errno set for any other failure (the caller names the
// file, as it did with open(2)). Folders the user names (--run_dir, --save_dir) may be links; only the
// last part of the path is not followed.
int open_output_file(const std::filesystem::path& path, int flags, const std::string& what);

// A write of a run file failed: thrown under --on_write_error stop; exit status 2 like any bad
// input (the user's disk, quota or permissions), with the file and the system's reason.
class WriteError : public UserError {
 public:
  WriteError(const std::filesystem::path& path, const std::string& reason);
  const std::filesystem::path& path() const { return path_; }
  const std::string& reason() const { return reason_; }

 private:
  std::filesystem::path path_;
  std::string reason_;
};

enum class WriteFailurePolicy { stop, warn };
// The run's policy for run files (--on_write_error); process-wide, set once at start-up.
void set_write_failure_policy(WriteFailurePolicy policy);
WriteFailurePolicy write_failure_policy();

// A failed write of a run file: under `warn`, logs once per path and returns; under `stop`, throws
// WriteError, or, while failures are deferred, keeps the first as pending and returns. `reason` is the
// system's (strerror) or a description.
void run_file_write_failed(const std::filesystem::path& path, const std::string& reason);

// While training steps run, a failed write must not end one rank alone mid-step (the others would
// wait for it in a collective, and no last checkpoint could be written): failures are kept, and the
// ranks agree on them at the step's end (trainer/preemption.h), then save and stop together.
void defer_write_failures(bool deferred);
// The first failure kept while deferred, taken (so it is raised once); nullptr when none.
std::unique_ptr<WriteError> take_pending_write_failure();
bool write_failure_pending();

// open_output_file(path, O_WRONLY | O_TRUNC) as a stdio stream ("wb"); nullptr with errno set as there.
std::FILE* open_output_stream(const std::filesystem::path& path, const std::string& what);

// Writes all `size` bytes to `descriptor` (retrying short writes and EINTR). Returns 0, or the errno
// of the failure (ENOSPC for a write that took nothing).
int write_fully(int descriptor, const void* data, size_t size);

// Writes `text` to `path` through a staging file (PATH.tmp, or PATH + `staging_suffix` where several
// processes may write the same file), fsync (unless `durable` is false: a file rewritten every few
// seconds whose loss costs nothing) and rename, every call checked; refuses a `path` that exists and
// is not a regular file, and a staging file that is a link (open_output_file). Throws WriteError
// (whatever the policy: the caller decides) naming the file; the staging file is removed on failure.
struct AtomicWrite {
  std::string staging_suffix = ".tmp";
  bool durable = true;
};
void write_file_atomically(const std::filesystem::path& path, std::string_view text, const AtomicWrite& how = {});

// create_directories, made durable: each folder it creates has its entry in its parent synced, up to
// the first folder that existed before (a power loss then cannot take back a folder the run went on to
// fill). Returns the error, empty on success.
std::error_code create_folders_durably(const std::filesystem::path& path);

// An append-only run file (metrics.jsonl, memory.rank<R>.jsonl): each line one write(2), checked. A
// line that fails is cut back off (the file never ends mid-line, so a reader such as `trainer report`
// still parses every line before it) and reported through run_file_write_failed; under `warn`, the
// file takes no more lines after its first failure.
class RunFile {
 public:
  RunFile() = default;
  ~RunFile();
  RunFile(const RunFile&) = delete;
  RunFile& operator=(const RunFile&) = delete;

  // Opens (creating it; appending or truncating): refuses an existing path that is not a regular
  // file, and throws WriteError whatever the policy when it cannot be opened (nothing is lost yet).
  void open(const std::filesystem::path& path, bool append);
  bool is_open() const { return descriptor_ >= 0; }
  void write_line(std::string_view line);  // adds the newline
  // Bytes written as one record (a binary file's, such as TensorBoard's events): one write(2),
  // checked, cut back off when it fails, as a line is.
  void write_record(std::string_view bytes);
  // Flushes to disk and closes, checked (a write the disk could not take shows here, at the latest).
  void close();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int descriptor_ = -1;
  off_t size_ = 0;  // the file's length: it is this run's alone (the run folder's lock), so kept here
  bool failed_ = false;
};

}  // namespace llm
