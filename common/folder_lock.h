// One job per folder: an exclusive advisory lock (flock) on FOLDER/.trainer.lock, held for the life of
// the process that took it.
//
// Why flock: the kernel drops it when the process ends, however it ends (SIGKILL, a node's OOM
// killer, a crash), so a killed job never leaves a stale lock to clean by hand, and a requeued job
// takes it at once. Two jobs on one --run_dir once interleaved their metrics.jsonl lines, and two on
// one --save_dir replaced each other's checkpoints: the second job is refused at start-up instead,
// naming the folder and the holder's host, process id and start time (written into the lock file by
// the holder; the lock file itself stays, it is not the lock). On NFS (v4) and Lustre mounted with
// `flock`, the lock holds across nodes; on a file system without locks, taking it fails and says so.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

namespace llm {

class FolderLock {
 public:
  // Takes the lock on `folder` (which must exist) or throws UserError: held by another process
  // ("<what> FOLDER is in use by another job: host H, process P, since T; ..."), or not lockable.
  // `what` names the folder for the message ("--run_dir").
  FolderLock(const std::filesystem::path& folder, const std::string& what);
  // The same mechanism for any output a subcommand writes (prepare's --output, a file or a shard
  // folder; export's --to): the lock is PARENT/.NAME.trainer.lock beside the output, so nothing is
  // created in or as the output before it is written, and the lock file goes when the lock is
  // released (a killed writer leaves it; the next one takes it, as with a folder's). Throws as above,
  // naming the output and its holder.
  static std::unique_ptr<FolderLock> output(const std::filesystem::path& output, const std::string& what);
  ~FolderLock();  // releases it (closing the file; an output's lock file is removed first)
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  const std::filesystem::path& folder() const { return folder_; }
  static constexpr const char* kFileName = ".trainer.lock";

 private:
  FolderLock(const std::filesystem::path& lock_file, const std::filesystem::path& named, const std::string& what,
             bool remove_when_released);
  void take(const std::filesystem::path& lock_file, const std::string& what, const std::string& noun);

  std::filesystem::path folder_;
  std::filesystem::path lock_file_;
  int descriptor_ = -1;
  bool remove_when_released_ = false;
};

}  // namespace llm
