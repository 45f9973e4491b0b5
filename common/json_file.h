// JSON files written by hand (a model config, a --data mixture file), read strictly.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace llm {

// The file's JSON. A UserError naming the file, with `what_to_pass` (what the user should give
// instead) where it helps, for a file that is missing, a folder, a device, FIFO or socket (a FIFO
// would block start-up), unreadable, empty or not JSON (nlohmann's line and column), and for a key
// given twice in one object (nlohmann's parser keeps the last without a word; the message names the
// key, dotted when nested, and the lines it is on).
nlohmann::json read_json_file(const std::string& path, const std::string& what_to_pass);

}  // namespace llm
