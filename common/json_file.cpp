#include "common/json_file.h"

#include <algorithm>
#include <filesystem>
#include <utility>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "common/errors.h"
#include "common/input_paths.h"

namespace llm {
namespace fs = std::filesystem;
using nlohmann::json;
namespace {

// Where "key" is written as a key in text: "line 3", "lines 2 and 17", or "" when not found.
std::string lines_naming_key(const std::string& text, const std::string& key) {
  std::vector<int> lines;
  const std::string quoted = "\"" + key + "\"";
  int line = 1;
  for (size_t at = 0; at < text.size(); ++at) {
    if (text[at] == '\n') ++line;
    if (text.compare(at, quoted.size(), quoted) != 0) continue;
    const size_t colon = text.find_first_not_of(" \t\r\n", at + quoted.size());
    if (colon != std::string::npos && text[colon] == ':' && (lines.empty() || lines.back() != line))
      lines.push_back(line);
  }
  std::string where;
  for (size_t i = 0; i < lines.size(); ++i)
    where += (i == 0 ? "" : i + 1 == lines.size() ? " and " : ", ") + std::to_string(lines[i]);
  return lines.empty() ? "" : (lines.size() == 1 ? "line " : "lines ") + where;
}

// nlohmann's parser keeps the last of two equal keys without a word, so a config edited by hand
// could hold "hidden_size" twice and silently train the second. The parser's callback sees every
// key of every object: a key seen twice in one object is a UserError naming it (nested keys as
// "rope_scaling.type") and, where they can be found, the lines it is on.
json parse_rejecting_duplicate_keys(const std::string& text, const std::string& path) {
  struct OpenObject {
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<OpenObject> open;
  const json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open.emplace_back();
    if (event == json::parse_event_t::object_end && !open.empty()) open.pop_back();
    if (event != json::parse_event_t::key || open.empty()) return true;
    const std::string key = parsed.get<std::string>();
    if (!open.back().keys.insert(key).second) {
      std::string dotted;
      for (size_t i = 0; i + 1 < open.size(); ++i) dotted += open[i].last_key + ".";
      const std::string where = lines_naming_key(text, key);
      fail_user(path, dotted + key,
                "given twice" + (where.empty() ? "" : " (" + where + ")") +
                    "; JSON readers keep only one of them, so delete the one you did not mean");
    }
    open.back().last_key = key;
    return true;
  };
  return json::parse(text, callback);
}

// Where a number literal that overflowed the parser sits: its line and the key it is the value of
// ("" when it is not an object's value), found by scanning the text (nlohmann says neither).
std::pair<int, std::string> locate_number(const std::string& text, const std::string& literal) {
  size_t at = 0;
  while ((at = text.find(literal, at)) != std::string::npos) {
    const bool starts = at == 0 || std::string(" \t\r\n:,[").find(text[at - 1]) != std::string::npos;
    const size_t after = at + literal.size();
    const bool ends = after >= text.size() || std::string(" \t\r\n,]}").find(text[after]) != std::string::npos;
    if (starts && ends) break;
    at = after;
  }
  if (at == std::string::npos) return {0, ""};
  const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
  // The value of "key": the nearest colon before it, with only blanks between, preceded by a string.
  size_t colon = text.find_last_not_of(" \t\r\n", at == 0 ? 0 : at - 1);
  if (colon == std::string::npos || text[colon] != ':') return {line, ""};
  const size_t close = text.find_last_not_of(" \t\r\n", colon - 1);
  if (close == std::string::npos || text[close] != '"') return {line, ""};
  const size_t open = text.rfind('"', close - 1);
  return {line, open == std::string::npos ? "" : text.substr(open + 1, close - open - 1)};
}

// The line (1-based) where `text`'s arrays and objects first nest deeper than `limit`, or 0. Brackets
// inside strings do not count; the text need not be valid JSON (the parser says what else is wrong).
int line_nesting_deeper_than(std::string_view text, int limit) {
  int depth = 0, line = 1;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (c == '\n') ++line;
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > limit) return line;
    } else if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  return 0;
}

void refuse_deep_nesting(std::string_view text, const std::string& source) {
  if (const int line = line_nesting_deeper_than(text, kMaxJsonDepth); line > 0)
    fail_user(source, "",
              "its JSON nests arrays or objects more than " + std::to_string(kMaxJsonDepth) + " deep (line " +
                  std::to_string(line) + "): no file the trainer reads nests more than a few levels; is it "
                  "damaged, or not the file meant?");
}

}  // namespace

json parse_json_text(std::string_view text, const std::string& source, bool allow_exceptions) {
  if (!allow_exceptions && line_nesting_deeper_than(text, kMaxJsonDepth) > 0) return json(json::value_t::discarded);
  refuse_deep_nesting(text, source);
  return json::parse(text, nullptr, allow_exceptions);
}

std::string json_excerpt(const json& value, size_t max_chars) {
  std::string text = value.dump();
  if (text.size() <= max_chars) return text;
  const size_t full = text.size();
  text.resize(max_chars > 3 ? max_chars - 3 : 0);
  return text + "... (" + std::to_string(full) + " characters)";
}

json read_json_file(const std::string& path, const std::string& what_to_pass) {
  // A device, fifo or socket: /dev/null reads as nothing and a fifo would block start-up forever;
  // a link to nothing or a loop of links is said as what it is (common/input_paths.h).
  const std::string not_regular = regular_file_problem(path);
  if (not_regular == "is missing") fail_user(path, "", std::string("no such file: ") + what_to_pass);
  if (not_regular == "is a folder, not a regular file")
    fail_user(path, "", std::string("is a folder, not a JSON file: ") + what_to_pass);
  if (!not_regular.empty()) fail_user(path, "", not_regular + ": " + what_to_pass);
  std::ifstream stream(path);
  if (!stream) fail_user(path, "", "cannot be opened for reading: check its permissions");
  const std::string text((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    fail_user(path, "", std::string("is empty: ") + what_to_pass);

  json object;
  try {
    refuse_deep_nesting(text, path);
    object = parse_rejecting_duplicate_keys(text, path);
  } catch (const json::parse_error& parse_error) {
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line L, column C: ...".
    std::string detail = parse_error.what();
    if (const size_t tag_end = detail.find("] "); detail.rfind("[json.exception", 0) == 0 &&
                                                  tag_end != std::string::npos)
      detail = detail.substr(tag_end + 2);
    fail_user(path, "", "invalid JSON: " + detail);
  } catch (const json::out_of_range& overflow) {
    // "[json.exception.out_of_range.406] number overflow parsing '1e999'": a literal beyond a double.
    const std::string detail = overflow.what();
    const size_t open = detail.find('\''), close = detail.rfind('\'');
    const std::string literal = open != std::string::npos && close > open ? detail.substr(open + 1, close - open - 1) : "";
    const auto [line, key] = locate_number(text, literal);
    fail_user(path, key,
              "the number " + (literal.empty() ? std::string("given") : literal) +
                  (line > 0 ? " (line " + std::to_string(line) + ")" : std::string()) +
                  " is beyond what a double holds (about 1.8e308): write a finite number");
  }
  return object;
}

}  // namespace llm
