// --init_from DIR: a transformers save_pretrained folder whose weights replace the seeded init.
//
// The folder holds config.json and either model.safetensors or model.safetensors.index.json with the
// shards it names. Opening it checks everything before the model is built (every failure a UserError,
// exit 2, naming the file and the key or tensor): config.json against --config (check_hf_config), and
// the tensors against the model's units (model/units.h) by HF name, exactly: a missing or an
// extra tensor, a wrong shape or an unreadable dtype is named. Rotary inv_freq buffers that older
// transformers saved are not weights and are skipped. A folder with pytorch_model.bin only is refused
// naming the file (reading torch's pickles of arbitrary Python objects is not done here; transformers
// re-saves it as safetensors with save_pretrained(DIR, safe_serialization=True)).
//
// Only headers are read at open. load_rows then reads, for one unit, only the rows this rank's shard
// holds (sharding/flat_layout.h: whole rows along dim 0, one byte range per tensor) and copies them into
// those rows of the unit's freshly built parameters (converted to their dtype), before the trainer
// shards the unit: a rank reads about 1/world_size of the folder (no_shard and one rank: all of it),
// and never holds more than one unsharded unit. The rows it does not read keep the seeded init,
// which the sharding drops. Each row read is checked finite: a NaN or inf weight is a UserError naming
// the file, the tensor and the first bad row (not a non-finite loss at step 1 blamed on --lr).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "sharding/flat_layout.h"
#include "checkpoint/interchange/safetensors.h"
#include "model/llama.h"
#include "model/model_config.h"

namespace llm {

class PretrainedFolder {
 public:
  // Throws UserError (see above). `log_notes` logs, once, the warnings worth a line (rank 0).
  PretrainedFolder(const std::string& folder, const ModelConfig& model, bool log_notes);

  // Copies the rows `layout` gives this rank of the folder's tensors of `unit` into the same rows of
  // `parameters` (the unit's HF-named parameters, in the layout's order, any device and dtype), one
  // byte range read at a time. Returns the bytes read.
  int64_t load_rows(const UnitSpec& unit, const NamedTensors& parameters, const FlatShardLayout& layout) const;
  // The bytes of the model's tensors in the folder (what reading every row would take).
  int64_t weight_bytes() const { return weight_bytes_; }

  const std::string& folder() const { return folder_; }

 private:
  std::string folder_;
  int64_t weight_bytes_ = 0;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> file_of_;  // tensor name -> the file holding it
};

// Opens --init_from when it is set (every rank), else nullptr.
std::unique_ptr<PretrainedFolder> open_init_from(const std::string& folder, const ModelConfig& model, bool log_notes);

}  // namespace llm
