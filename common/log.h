// Human-readable logging through spdlog, behind a header that includes neither spdlog nor fmt.
//
// Why the indirection: the torch wheel ships its own fmt (12.x) in its include folder, and Debian's
// spdlog is built against the system fmt (9.x). A translation unit that sees LibTorch's include path
// picks up the wrong fmt, so spdlog lives in one small library (trainer_log) that never sees it.
#pragma once

#include <string>
#include <utility>

#include <fmt/format.h>  // whichever fmt the including target sees; only std::string crosses over

namespace llm::log {

// Prefixes every line with "[rank R]" when world_size > 1; call once after MPI start.
void configure(int rank, int world_size);
void info(const std::string& message);
void warn(const std::string& message);
void error(const std::string& message);

// fmt-style conveniences: llm::log::info("wrote {} ({} tokens)", path, count).
template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  info(fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  warn(fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace llm::log
