#include "data/npy_header.h"

#include <charconv>
#include <cstddef>
#include <string_view>
#include <utility>

#include "common/errors.h"

namespace llm {
namespace {

// A recursive-descent reader of the one dict literal a .npy header is.
class NpyHeaderReader {
 public:
  NpyHeaderReader(const std::string& text, const std::string& path) : text_(text), path_(path) {}

  NpyHeader read() {
    NpyHeader header;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    expect('{', "the dict's opening {");
    while (!take('}')) {
      const size_t key_at = at_;
      const std::string key = string_literal("a quoted key");
      expect(':', "a : after the key '" + key + "'");
      bool* seen = key == "descr" ? &seen_descr : key == "fortran_order" ? &seen_fortran : key == "shape" ? &seen_shape : nullptr;
      if (seen == nullptr) fail("the key '" + key + "' is none of 'descr', 'fortran_order', 'shape'", key_at);
      if (*seen) fail("the key '" + key + "' is given twice", key_at);
      *seen = true;
      if (key == "descr") {
        skip_space();
        if (at_ < text_.size() && text_[at_] == '[') fail("'descr' is a list of fields (a structured dtype), not one dtype", at_);
        header.descr = string_literal("a quoted dtype for 'descr'");
      } else if (key == "fortran_order") {
        header.fortran_order = boolean();
      } else {
        header.shape = shape();
      }
      if (!take(',')) {
        expect('}', "a , or the dict's closing }");
        break;
      }
    }
    skip_space();
    if (at_ != text_.size()) fail("text after the dict's closing }", at_);
    if (!seen_descr || !seen_fortran || !seen_shape)
      fail(std::string("the key '") + (!seen_descr ? "descr" : !seen_fortran ? "fortran_order" : "shape") + "' is missing", at_);
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& what, size_t at) const {
    std::string shown = text_;
    while (!shown.empty() && (shown.back() == ' ' || shown.back() == '\n')) shown.pop_back();
    if (shown.size() > 200) shown = shown.substr(0, 200) + "...";
    fail_user(path_, "header", "the .npy header is not the dict NumPy writes: " + what + " (at character " +
                                   std::to_string(at) + " of " + shown + "); save the array with numpy.save");
  }
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r')) ++at_;
  }
  bool take(char c) {
    skip_space();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c, const std::string& what) {
    if (!take(c)) fail("expected " + what, at_);
  }
  // 'text' or "text"; a backslash takes the next character as it is (no dtype needs more).
  std::string string_literal(const std::string& what) {
    skip_space();
    if (at_ >= text_.size() || (text_[at_] != '\'' && text_[at_] != '"')) fail("expected " + what, at_);
    const char quote = text_[at_];
    const size_t start = at_++;
    std::string value;
    while (at_ < text_.size() && text_[at_] != quote && text_[at_] != '\n') {
      if (text_[at_] == '\\' && at_ + 1 < text_.size()) ++at_;
      value += text_[at_++];
    }
    if (at_ >= text_.size() || text_[at_] != quote) fail("a string that is never closed", start);
    ++at_;
    return value;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair<const char*, bool>{"True", true}, {"False", false}}) {
      const std::string_view name(word);
      if (text_.compare(at_, name.size(), name) == 0) {
        at_ += name.size();
        return value;
      }
    }
    fail("'fortran_order' is not True or False", at_);
  }
  // (N,), (N, M), (), (N) or [N, M]: integers, with or without a trailing comma.
  std::vector<uint64_t> shape() {
    skip_space();
    const char open = at_ < text_.size() ? text_[at_] : '\0';
    if (open != '(' && open != '[') fail("'shape' is not a tuple of integers such as (1000,)", at_);
    const char close = open == '(' ? ')' : ']';
    ++at_;
    std::vector<uint64_t> dimensions;
    while (!take(close)) {
      dimensions.push_back(integer());
      if (!take(',')) {
        expect(close, std::string("a , or the shape's closing ") + close);
        break;
      }
    }
    return dimensions;
  }
  uint64_t integer() {
    skip_space();
    const size_t start = at_;
    uint64_t value = 0;
    const auto [end, error] = std::from_chars(text_.data() + at_, text_.data() + text_.size(), value);
    if (end == text_.data() + at_) fail("expected a dimension of 'shape' (a whole number)", start);
    if (error != std::errc()) fail("a dimension of 'shape' beyond 2^64", start);
    at_ = static_cast<size_t>(end - text_.data());
    if (at_ < text_.size() && (text_[at_] == 'L' || text_[at_] == 'l')) ++at_;  // Python 2's long: 1000L
    return value;
  }

  const std::string& text_;
  const std::string& path_;
  size_t at_ = 0;
};

}  // namespace

NpyHeader parse_npy_header(const std::string& text, const std::string& path) {
  return NpyHeaderReader(text, path).read();
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace llm
