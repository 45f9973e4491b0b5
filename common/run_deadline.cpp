#include "common/run_deadline.h"

#include <unistd.h>

#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
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

std::optional<double> max_runtime_end_epoch(const std::string& text, double start_epoch, std::string* why) {
  const auto refuse = [&](const std::string& reason) -> std::optional<double> {
    if (why != nullptr) *why = reason;
    return std::nullopt;
  };
  if (text.empty()) return refuse("it is empty");
  char* end = nullptr;
  const double minutes = std::strtod(text.c_str(), &end);
  if (end != text.c_str() && *end == '\0') {
    if (!std::isfinite(minutes) || minutes <= 0) return refuse("minutes must be a finite number above 0");
    return start_epoch + 60 * minutes;
  }
  // An end time: YYYY-MM-DDTHH:MM[:SS], local time, each field read as written and checked against
  // the calendar (mktime would move 2026-02-30 to March 2 and 25:00 to the next day, silently).
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0, used = 0;
  const bool with_seconds = text.size() == 19;
  const char* format = with_seconds ? "%4d-%2d-%2dT%2d:%2d:%2d%n" : "%4d-%2d-%2dT%2d:%2d%n";
  const int fields = with_seconds ? std::sscanf(text.c_str(), format, &year, &month, &day, &hour, &minute, &second, &used)
                                  : std::sscanf(text.c_str(), format, &year, &month, &day, &hour, &minute, &used);
  const bool digits_where_expected = [&] {
    for (size_t i = 0; i < text.size(); ++i) {
      const bool separator = i == 4 || i == 7 || i == 10 || i == 13 || i == 16;
      if (!separator && !std::isdigit(static_cast<unsigned char>(text[i]))) return false;
    }
    return true;
  }();
  if ((text.size() != 16 && !with_seconds) || fields != (with_seconds ? 6 : 5) || used != static_cast<int>(text.size()) ||
      !digits_where_expected)
    return refuse("it is neither a number of minutes nor an end time YYYY-MM-DDTHH:MM[:SS]");
  static const char* const kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                                        "July",    "August",   "September", "October", "November", "December"};
  if (month < 1 || month > 12) return refuse("there is no month " + std::to_string(month) + " (months are 01 to 12)");
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  const int days_in_month[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (day < 1 || day > days_in_month[month - 1])
    return refuse(std::string(kMonths[month - 1]) + " " + std::to_string(year) + " has " +
                  std::to_string(days_in_month[month - 1]) + " days, so there is no day " + std::to_string(day));
  if (hour > 23) return refuse("there is no hour " + std::to_string(hour) + " (hours are 00 to 23)");
  if (minute > 59) return refuse("there is no minute " + std::to_string(minute) + " (minutes are 00 to 59)");
  if (second > 59) return refuse("there is no second " + std::to_string(second) + " (seconds are 00 to 59)");
  std::tm when{};
  when.tm_year = year - 1900;
  when.tm_mon = month - 1;
  when.tm_mday = day;
  when.tm_hour = hour;
  when.tm_min = minute;
  when.tm_sec = second;
  when.tm_isdst = -1;
  const std::time_t at = std::mktime(&when);
  if (at == static_cast<std::time_t>(-1)) return refuse("this machine cannot represent that time");
  // A local time skipped by a daylight-saving change (02:30 on the spring's change) is moved by mktime.
  if (when.tm_hour != hour || when.tm_min != minute || when.tm_mday != day)
    return refuse("that local time does not exist here (a daylight-saving change skips it)");
  return static_cast<double>(at);
}

}  // namespace llm
