// The memory estimate's timeline (memory/estimate_simulation.h): the live bytes of each category as
// the simulated step allocates and frees, the peak of each window between the ledger's points, and
// the tape a deep model's simulation records for extrapolation. Internal to the estimate.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/categories.h"
#include "memory/estimate.h"

namespace llm {

// Category indices of MemoryCategories::at().
constexpr int kParameters = 0, kGradients = 1, kOptimizerDevice = 2, kOptimizerHost = 3, kActivations = 4, kOther = 5;

// One step of the timeline as recorded for extrapolation (see extrapolate_layers,
// estimate_extrapolation.cpp): consecutive adds of non-negative bytes are one add (the window's peak
// after them is the total after the last), consecutive removes one remove, consecutive spikes one
// spike of the largest.
struct TimelineOp {
  enum class Kind { add, remove, spike, point, open_window } kind = Kind::add;
  MemoryCategories bytes;  // add, remove
  int64_t spike = 0;       // spike
  std::string label;       // point
  bool merges = true;      // an add of negative bytes is kept apart

  static TimelineOp of(Kind kind, int64_t spike = 0, const std::string& label = "") {
    TimelineOp op;
    op.kind = kind;
    op.spike = spike;
    op.label = label;
    return op;
  }
  // Equal but for the label.
  bool same_bytes(const TimelineOp& other) const {
    for (int c = 0; c < MemoryCategories::kCount; ++c)
      if (bytes.at(c) != other.bytes.at(c)) return false;
    return kind == other.kind && spike == other.spike && merges == other.merges;
  }
};

// The step as the trainer runs it, one tensor lifetime at a time, with the ledger's points.
// `add`/`remove` move a category's live bytes; `spike` is a transient on top of what is live (it
// raises the window's peak only); `point` closes a window as MemoryLedger::point does.
class Timeline {
 public:
  // host_apart: the device is a GPU, so host memory (offloaded optimizer state) is counted in its
  // category but not in the device's total, as MemoryLedger::point does.
  explicit Timeline(bool host_apart = false) : host_apart_(host_apart) {}
  // Every later operation is also appended to `tape` (merged as TimelineOp says).
  void record_to(std::vector<TimelineOp>* tape) { tape_ = tape; }
  void add(int category, int64_t bytes) {
    if (tape_ != nullptr) record_bytes(TimelineOp::Kind::add, category, bytes);
    live_.at(category) += bytes;
    if (host_apart_ && category == kOptimizerHost) return;
    total_ += bytes;
    window_peak_ = std::max(window_peak_, total_);
  }
  void remove(int category, int64_t bytes) {
    if (tape_ != nullptr) record_bytes(TimelineOp::Kind::remove, category, bytes);
    live_.at(category) -= bytes;
    if (host_apart_ && category == kOptimizerHost) return;
    total_ -= bytes;
  }
  void spike(int64_t bytes) {
    if (tape_ != nullptr) {
      if (tape_->empty() || tape_->back().kind != TimelineOp::Kind::spike) tape_->push_back(TimelineOp::of(TimelineOp::Kind::spike, bytes));
      tape_->back().spike = std::max(tape_->back().spike, bytes);
    }
    window_peak_ = std::max(window_peak_, total_ + bytes);
  }
  void point(const std::string& label) {
    if (tape_ != nullptr) tape_->push_back(TimelineOp::of(TimelineOp::Kind::point, 0, label));
    phases_.push_back({label, window_peak_, live_});
    window_peak_ = total_;
  }
  void open_window() {
    if (tape_ != nullptr) tape_->push_back(TimelineOp::of(TimelineOp::Kind::open_window));
    window_peak_ = total_;
  }
  // A recorded operation again; a point under `label`.
  void replay(const TimelineOp& op, const std::string& label) {
    switch (op.kind) {
      case TimelineOp::Kind::add:
        for (int c = 0; c < MemoryCategories::kCount; ++c) move(c, op.bytes.at(c));
        window_peak_ = std::max(window_peak_, total_);
        break;
      case TimelineOp::Kind::remove:
        for (int c = 0; c < MemoryCategories::kCount; ++c) move(c, -op.bytes.at(c));
        break;
      case TimelineOp::Kind::spike: spike(op.spike); break;
      case TimelineOp::Kind::point: point(label); break;
      case TimelineOp::Kind::open_window: open_window(); break;
    }
  }
  // Right after a point: `times` more of a stretch that moved the live bytes by `delta`, without
  // listing its points (a stretch that opens after a point and closes with one only translates).
  void skip(const MemoryCategories& delta, int64_t times) {
    for (int c = 0; c < MemoryCategories::kCount; ++c) move(c, delta.at(c) * times);
    window_peak_ = total_;
  }
  int64_t total() const { return total_; }
  const MemoryCategories& live() const { return live_; }
  const std::vector<PhaseEstimate>& phases() const { return phases_; }

 private:
  void move(int category, int64_t bytes) {
    live_.at(category) += bytes;
    if (!(host_apart_ && category == kOptimizerHost)) total_ += bytes;
  }
  void record_bytes(TimelineOp::Kind kind, int category, int64_t bytes) {
    const bool merges = kind == TimelineOp::Kind::remove || bytes >= 0;
    if (tape_->empty() || tape_->back().kind != kind || !tape_->back().merges || !merges) {
      tape_->push_back(TimelineOp::of(kind));
      tape_->back().merges = merges;
    }
    tape_->back().bytes.at(category) += bytes;
  }

  bool host_apart_;
  MemoryCategories live_;
  int64_t total_ = 0;
  int64_t window_peak_ = 0;
  std::vector<PhaseEstimate> phases_;
  std::vector<TimelineOp>* tape_ = nullptr;
};

}  // namespace llm
