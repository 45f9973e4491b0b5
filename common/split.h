// A comma-separated list's items, in order, empty ones kept ("a,,b" -> a, "", b; "" -> one empty
// item), so a caller's check names the empty item rather than skipping it.
#pragma once

#include <string>
#include <vector>

namespace llm {

inline std::vector<std::string> split_list(const std::string& list, char separator = ',') {
  std::vector<std::string> items;
  size_t begin = 0;
  for (;;) {
    const size_t end = list.find(separator, begin);
    items.push_back(list.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return items;
    begin = end + 1;
  }
}

}  // namespace llm
