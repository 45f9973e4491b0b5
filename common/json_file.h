// JSON read from files: every reader of JSON parses through parse_json_text, which bounds the
// nesting depth, and prints a value in a message through json_excerpt, which bounds its length; JSON
// files written by hand (a model config, a --data mixture file) are read strictly by read_json_file.
//
// Why a depth bound: nlohmann's parser is iterative, but dump(), copies and comparisons recurse, so a
// value nested 100,000 deep (a 200 KB file: a config, a manifest, a safetensors header) crashed the
// program with SIGSEGV and no message the moment anything printed or copied it. No file the trainer
// reads nests more than a few levels.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace llm {

// The file's JSON. A UserError naming the file, with `what_to_pass` (what the user should give
// instead) where it helps, for a file that is missing, a folder, a device, FIFO or socket (a FIFO
// would block start-up), unreadable, empty or not JSON (nlohmann's line and column), and for a key
// given twice in one object (nlohmann's parser keeps the last without a word; the message names the
// key, dotted when nested, and the lines it is on).
nlohmann::json read_json_file(const std::string& path, const std::string& what_to_pass);

// Deeper than this a text is refused before it is parsed (a config nests 3 levels, a manifest 4).
constexpr int kMaxJsonDepth = 64;

// nlohmann::json::parse(text, nullptr, allow_exceptions) after the depth check: nesting deeper than
// kMaxJsonDepth is a UserError naming `source` (a file, "FILE line N") and the line where it goes too
// deep, or a discarded value when `allow_exceptions` is false (as any text that is not JSON).
nlohmann::json parse_json_text(std::string_view text, const std::string& source, bool allow_exceptions = true);

// `value` as JSON text cut to at most `max_chars` characters ("..." and its full length when cut):
// what a message prints of a value read from a file, however large that value is.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80);

}  // namespace llm
