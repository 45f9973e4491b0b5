// `trainer prepare`'s checks of its inputs and outputs, before anything is read or written: each
// input a readable regular file of text (plain, gzip or zstd; JSON Lines with its text key), the
// outputs none of the inputs, an existing output only with --overwrite (data/prepare.cpp runs them).
#pragma once

#include <string>
#include <vector>

#include "data/prepare.h"

namespace llm {

// The inputs for a message: "a.txt", "a.txt, b.txt", or "a.txt, b.txt and 3 more".
std::string describe_inputs(const std::vector<std::string>& inputs);

// --input items that name no file but hold a glob pattern become their matches, in name order (a
// pattern the shell did not expand because it was quoted); a pattern without a match is a UserError.
std::vector<std::string> expand_input_globs(const std::vector<std::string>& inputs);

// Where a trained tokenizer goes: beside the token file, or into the shards' folder.
std::string trained_tokenizer_path(const PrepareOptions& options);

// Every input and output of OPTIONS (inputs already expanded): a UserError naming the first wrong.
void check_inputs(const PrepareOptions& options);

}  // namespace llm
