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

// Writes `text` to `path` through PATH.tmp, fsync and rename, every call checked; refuses a `path`
// that exists and is not a regular file. Throws WriteError (whatever the policy: the caller decides)
// naming the file.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

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
