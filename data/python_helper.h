// The project's Python helpers that `trainer prepare` runs for what maintained Python libraries read
// best: data/hf_encode.py (the tokenizers library) and data/parquet_text.py (pyarrow). Where the
// interpreter and the scripts are, and how a helper is started with its standard streams on pipes.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace llm {

// The project's Python for helper scripts: TRAINER_PYTHON from the environment, else the one the
// build was configured with (if it exists), else python3.
std::string project_python();
// A script of the source tree (e.g. "data/hf_encode.py"): in the tree the build was made from, else
// in the nearest folder above the running binary that holds it.
std::string project_script(const std::string& relative);

// Starts `arguments` (the first looked up on PATH) with `in`, `out` and `err` as its standard
// streams (-1: this process's) and `close_in_child` closed in it. Returns its pid, or -1 with the
// reason in *why.
pid_t spawn_helper(std::vector<std::string> arguments, int in, int out, int err,
                   const std::vector<int>& close_in_child, std::string* why);

}  // namespace llm
