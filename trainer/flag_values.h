// How one flag's text becomes a value, for every verb of the command line (trainer/cli.h): an enum
// flag is read through its to_string() spellings, and every number is read whole by one strict
// reader, read_number, rather than by CLI11's conversion; NumberFlags adds the numeric flags and
// refuses one added any other way. Also the warning for a flag given twice with different values.
// Apart from cli.cpp because both the training flags (trainer/training_flags.h) and the verbs'
// flags are added through it.
#pragma once

#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/errors.h"
#include "model/model_config.h"

namespace llm {

// The text spelling of each enum is the one to_string() gives, so help, flags and JSON agree.
// VALUES: every value of the enum, a list of config/config.h.
template <typename Enum, std::size_t N>
std::map<std::string, Enum> spellings(const std::array<Enum, N>& values) {
  std::map<std::string, Enum> by_name;
  for (Enum value : values) by_name.emplace(to_string(value), value);
  return by_name;
}

template <typename Enum>
std::vector<std::string> names_of(const std::map<std::string, Enum>& by_name) {
  std::vector<std::string> names;
  for (const auto& entry : by_name) names.push_back(entry.first);
  return names;
}

// An enum flag is read as a string restricted to its spellings, converted after parsing.
template <typename Enum>
struct EnumFlag {
  std::map<std::string, Enum> by_name;
  std::string text;

  template <std::size_t N>
  EnumFlag(const std::array<Enum, N>& values, Enum initial) : by_name(spellings(values)), text(to_string(initial)) {}
  CLI::Option* add(CLI::App& app, const char* flag, const char* help) {
    return app.add_option(flag, text, help)->check(CLI::IsMember(names_of(by_name)))
        ->capture_default_str();
  }
  Enum value() const { return by_name.at(text); }
};

// ---- Numbers --------------------------------------------------------------------------------------
// Every number on the command line is read by read_number: the whole text, in decimal, within the
// range of its field's type or the narrower range a flag gives. CLI11's own conversion reads none of
// them: its strtoll clamps 99999999999999999999 to INT64_MAX, reads 010 as octal and 0x10 as hex,
// its strtoull wraps -1 to 2^64-1, and its strtold takes inf, nan and 1e999 (inf). A text outside is
// a UserError naming the flag, the text as typed and the range. Ranges that depend on other flags
// or on the model stay with validate_run_config.

template <typename Number>
struct NumberRange {
  Number lowest = std::numeric_limits<Number>::lowest();
  Number highest = std::numeric_limits<Number>::max();
  // The message's "expected ...", when the bounds alone do not say what the flag takes.
  std::string words;
};

template <typename Number>
std::string number_text(Number value) {
  if constexpr (std::is_floating_point_v<Number>) return format_number(value);
  else return std::to_string(value);
}

// What a flag takes, for its message: the words it gives, else its bounds when narrower than its
// type's; at the type's own bounds only the kind of number (the "got" then says which end was passed).
template <typename Number>
std::string range_words(const NumberRange<Number>& range) {
  if (!range.words.empty()) return range.words;
  const bool whole_type = range.lowest == std::numeric_limits<Number>::lowest() &&
                          range.highest == std::numeric_limits<Number>::max();
  if constexpr (std::is_floating_point_v<Number>) {
    return whole_type ? "a finite number"
                      : "a number from " + format_number(range.lowest) + " to " + format_number(range.highest);
  } else {
    if (whole_type) return std::is_unsigned_v<Number> ? "an integer >= 0" : "an integer";
    return "an integer from " + std::to_string(range.lowest) + " to " + std::to_string(range.highest);
  }
}

// The number TEXT spells, whole: digits (for a real number also a point and an exponent), no sign
// but '-', no blanks, no hex, finite and within Number's range. Otherwise nullopt, and `past_range`
// says whether TEXT is a number beyond the type's range (too large, or for a double also too small).
template <typename Number>
std::optional<Number> whole_number(const std::string& text, bool* past_range = nullptr) {
  const char* first = text.data();
  const char* last = first + text.size();
  Number value{};
  std::from_chars_result read{};
  if constexpr (std::is_floating_point_v<Number>) read = std::from_chars(first, last, value, std::chars_format::general);
  else read = std::from_chars(first, last, value, 10);
  const bool whole = !text.empty() && read.ptr == last;
  if (past_range != nullptr) *past_range = whole && read.ec == std::errc::result_out_of_range;
  if (!whole || read.ec != std::errc()) return std::nullopt;
  if constexpr (std::is_floating_point_v<Number>)
    if (!std::isfinite(value)) return std::nullopt;  // inf, nan
  return value;
}

// TEXT as the value of FLAG, or a UserError naming the flag, the text as typed and the range.
template <typename Number>
Number read_number(const std::string& flag, const std::string& text, const NumberRange<Number>& range = {}) {
  bool past_range = false;
  const std::optional<Number> value = whole_number<Number>(text, &past_range);
  if (value && *value >= range.lowest && *value <= range.highest) return *value;
  std::string got = text.empty() ? "nothing" : text;
  if (past_range && range.words.empty()) {  // a flag's own words already say its range
    const bool negative = text.front() == '-';
    if constexpr (std::is_floating_point_v<Number>) {
      const bool tiny = std::strtod(text.c_str(), nullptr) == 0;  // strtod tells underflow from overflow
      got += tiny ? ", closer to 0 than the smallest double, " + format_number(std::numeric_limits<Number>::denorm_min()) +
                        ": write 0 for zero"
                  : negative ? ", below the lowest double, " + format_number(std::numeric_limits<Number>::lowest())
                             : ", above the largest double, " + format_number(std::numeric_limits<Number>::max());
    } else {
      got += negative ? ", below the smallest " + std::to_string(8 * sizeof(Number)) + "-bit integer, " +
                            std::to_string(std::numeric_limits<Number>::min())
                      : ", above the largest " + std::to_string(8 * sizeof(Number)) + "-bit integer, " +
                            std::to_string(std::numeric_limits<Number>::max());
    }
  }
  fail_user(kCommandLine, flag, "expected " + range_words(range) + " (got " + got + ")");
}

// The numeric flags, each bound to its field through read_number. check_every_number_is_ours walks
// the finished command line and refuses (a programming error) a numeric option made any other way,
// so a new flag cannot bypass the strict reading.
class NumberFlags {
 public:
  template <typename Number>
  CLI::Option* add(CLI::App& app, const std::string& flag, Number& field, const std::string& help,
                   NumberRange<Number> range = {}) {
    CLI::Option* option = app.add_option_function<std::string>(
        flag, [&field, flag, range](const std::string& text) { field = read_number(flag, text, range); }, help);
    option->type_name(std::is_floating_point_v<Number> ? "FLOAT" : std::is_unsigned_v<Number> ? "UINT" : "INT");
    option->default_function([&field] { return number_text(field); });
    ours_.insert(option);
    return option;
  }

  // Throws std::logic_error naming a numeric option of APP (or of its subcommands) not added by add.
  void check_every_number_is_ours(const CLI::App& app) const;

 private:
  std::set<const CLI::Option*> ours_;
};

// Flags given more than once with different values: the last one is used (TakeLast), and the user
// is told, since a repeated flag is as often a leftover as an override.
void collect_repeated_flags(const CLI::App& app, std::vector<std::string>& warnings);

}  // namespace llm
