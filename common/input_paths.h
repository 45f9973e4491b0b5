// What the trainer reads from folders that may come from someone else (a checkpoint, a transformers
// folder, token shards, a run folder for `trainer report`), checked by one rule each (issue 44;
// docs/security.md says what is trusted and what is not):
//   - a name read from a file (a manifest's "files", an index's shard names) is a plain name inside
//     its folder: not empty, not "." or "..", no '/', not absolute. Anything else makes the file
//     damaged, named with its entry, before any path is made from it: nothing outside the folder is
//     opened or stat'ed because a file said so;
//   - a file read is a regular file (a symbolic link to one is followed). A fifo, a device (a link to
//     /dev/zero), a socket, a folder, a symbolic link to nothing or a loop of links is said as what it
//     is, never as "missing" and never skipped: a fifo would block the reader, a device never ends.
#pragma once

#include <filesystem>
#include <string>

namespace llm {

// "" when `name` is a plain name inside a folder; else why not ("is empty", "is \"..\"", "holds a
// '/'", "is an absolute path").
std::string plain_name_problem(const std::string& name);

// UserError "SOURCE: KEY: \"NAME\" WHY: not a plain file name inside the folder; the file is damaged
// or was not written by this trainer" unless `name` is a plain name.
void require_plain_name(const std::string& name, const std::string& source, const std::string& key);

// "" when `path` is a regular file (following symbolic links); else what it is, as a phrase that
// follows the path: "is missing", "is a fifo, not a regular file", "is a symbolic link to /dev/zero,
// a character device, not a regular file", "is a symbolic link to nothing (x.bin), not a regular
// file", "is a loop of symbolic links, not a regular file", "is a folder, not a regular file".
std::string regular_file_problem(const std::filesystem::path& path);

// UserError "SOURCE: KEY: PATH WHAT (WHY)" unless `path` is a regular file; `why` says what it was
// to be read as ("listed in manifest.json", "a token file in --data's folder").
void require_regular_file(const std::filesystem::path& path, const std::string& source, const std::string& key,
                          const std::string& why);

}  // namespace llm
