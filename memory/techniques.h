// `trainer report --techniques RUN_DIR... [--context_sweep RUN_DIR...] [--out DIR]`: what each memory
// technique buys, alone and combined, and how peak memory grows with the context length. Writes
//   OUT/techniques.md                     per world size, a row per run: its techniques (read from the
//                                         run's settings), the tracked peak per rank and its share of
//                                         the baseline's, tokens/s and its share, the final loss, and
//                                         the estimate beside the peak; then the context-length sweep:
//                                         per dtype and context length the peak of a forward-only pass
//                                         (the evaluation forward, no autograd graph) and of a training
//                                         step, measured and estimated
//   OUT/techniques/peak_share.svg         the shares as bars, a section per world size
//   OUT/techniques/context_length.svg     the sweep's peaks over the context length
// The first technique run of each world size is that world size's baseline. All runs must train
// the same model on the same device; technique runs the micro-batch and context length of their
// baseline (a share of another workload means nothing); sweep runs the world size and batch size of
// each other, with one run per (dtype, context length). Anything else is a UserError naming the run
// (exit 2).
#pragma once

#include <string>
#include <vector>

namespace llm {

void write_techniques_report(const std::vector<std::string>& technique_dirs, const std::vector<std::string>& sweep_dirs,
                             const std::string& out_dir);

}  // namespace llm
