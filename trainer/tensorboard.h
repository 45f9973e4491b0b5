// TensorBoard event files, written by rank 0 as the run goes (--tensorboard_dir): what `tensorboard
// --logdir DIR` shows while the run trains, and what `wandb sync --sync-tensorboard DIR` uploads.
//
// Format. A file is a sequence of TFRecords: the data's length (uint64, little-endian), the masked
// CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data (masked: ((crc >> 15) |
// (crc << 17)) + 0xa282ead8). Each record's data is one tensorboard.Event (trainer/tensorboard.proto,
// TensorBoard's messages and field numbers, serialised by protobuf-lite): first the file version
// "brain.Event:2", then summaries. A record is one checked write (common/output_files.h), so a
// reader sees whole events as soon as they are written.
//
// Restarts. Every start of a run opens a new file, named so that it sorts after the files before it
// (events.out.tfevents.<unix seconds>.<first step>.<host>.<pid>). A resumed run first writes a
// SessionLog START at its first step: TensorBoard's reader then drops whatever the files before it
// hold at that step or later (the steps a preempted run trained past its checkpoint), as
// torch.utils.tensorboard's purge_step does, so the curves go on without a duplicated or stale step.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/output_files.h"

namespace llm {

// One TFRecord of `data` (above). Exposed for tests.
std::string tfrecord(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it. first_step > 1 (a resumed run): a SessionLog START at it.
  TensorBoardWriter(const std::filesystem::path& dir, int64_t first_step);

  // Scalars of one step, in one event (their tags as given: "train/loss", ...).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // Markdown text under `tag` (TensorBoard's text plugin).
  void text(const std::string& tag, int64_t step, const std::string& markdown);
  // A checkpoint written at `step` to `path`: a SessionLog CHECKPOINT, and a text under "checkpoints"
  // (the text is what TensorBoard shows; the session log is what other readers see).
  void checkpoint(int64_t step, const std::string& path);

  const std::filesystem::path& path() const { return file_.path(); }

 private:
  void write(const std::string& event);
  RunFile file_;
};

}  // namespace llm
