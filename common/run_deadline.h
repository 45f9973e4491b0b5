// --max_runtime: how long a run may take, for a job that must end before its allocation does
// (Megatron's --exit-duration-in-mins). Either minutes from the process's start ("230", "1.5") or
// an end time in this machine's local time ("2026-11-26T18:00" or "2026-11-26T18:00:30").
// The training loop stops at the first step boundary where one more step and a save would pass it
// (trainer/train_loop.cpp), saves, and exits 0.
#pragma once

#include <optional>
#include <string>

namespace llm {

// When this process started, in seconds since the epoch (/proc/self/stat; now, where unreadable).
double process_start_epoch();
double now_epoch();

// The run's end in seconds since the epoch, or nullopt when `text` is neither a positive finite number
// of minutes nor an end time of the forms above that is on the calendar (no 2026-02-30, 25:00, month
// 13, or a local time a daylight-saving change skips); then `why`, when given, says what is wrong.
std::optional<double> max_runtime_end_epoch(const std::string& text, double start_epoch, std::string* why = nullptr);

}  // namespace llm
