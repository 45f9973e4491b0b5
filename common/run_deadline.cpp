#include "common/run_deadline.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace llm {

double now_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double process_start_epoch() {
  // Field 22 of /proc/self/stat: the start in clock ticks after boot; /proc/uptime: seconds since boot.
  std::ifstream stat("/proc/self/stat"), uptime_file("/proc/uptime");
  std::string text;
  double uptime = 0;
  if (!std::getline(stat, text) || !(uptime_file >> uptime)) return now_epoch();
  const size_t name_end = text.rfind(')');  // the command name may hold spaces
  if (name_end == std::string::npos) return now_epoch();
  std::istringstream fields(text.substr(name_end + 2));
  std::string field;
  for (int index = 3; index <= 22 && fields >> field; ++index)
    if (index == 22) {
      const double ticks = std::strtod(field.c_str(), nullptr);
      const long per_second = ::sysconf(_SC_CLK_TCK);
      if (per_second <= 0) return now_epoch();
      return now_epoch() - uptime + ticks / static_cast<double>(per_second);
    }
  return now_epoch();
}

std::optional<double> max_runtime_end_epoch(const std::string& text, double start_epoch) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double minutes = std::strtod(text.c_str(), &end);
  if (end != text.c_str() && *end == '\0') {
    if (!std::isfinite(minutes) || minutes <= 0) return std::nullopt;
    return start_epoch + 60 * minutes;
  }
  // An end time: YYYY-MM-DDTHH:MM[:SS], local time.
  std::tm when{};
  std::istringstream in(text);
  in >> std::get_time(&when, "%Y-%m-%dT%H:%M");
  if (in.fail()) return std::nullopt;
  if (in.peek() == ':') {
    in.get();
    int seconds = -1;
    in >> seconds;
    if (in.fail() || seconds < 0 || seconds > 60) return std::nullopt;
    when.tm_sec = seconds;
  }
  if (in.peek() != std::char_traits<char>::eof()) return std::nullopt;
  when.tm_isdst = -1;
  const std::time_t at = std::mktime(&when);
  if (at == static_cast<std::time_t>(-1)) return std::nullopt;
  return static_cast<double>(at);
}

}  // namespace llm
