// --init_from DIR: a transformers save_pretrained folder whose weights replace the seeded init.
//
// The folder holds config.json and either model.safetensors or model.safetensors.index.json with the
// shards it names. Opening it checks everything before the model is built (every failure a UserError,
// exit 2, naming the file and the key or tensor): config.json against --config (check_hf_config), and
// the tensors against the model's units (trainer/model/units.h) by HF name, exactly: a missing or an
// extra tensor, a wrong shape or an unreadable dtype is named. Rotary inv_freq buffers that older
// transformers saved are not weights and are skipped. A folder with pytorch_model.bin only is refused
// naming the file (reading torch's pickles of arbitrary Python objects is not done here; transformers
// re-saves it as safetensors with save_pretrained(DIR, safe_serialization=True)).
//
// Only headers are read at open. load_unit then reads one unit's tensors, each from its own byte range
// of its shard, and copies them into the unit's freshly built parameters (converted to their dtype),
// before the trainer shards the unit: no rank ever holds more than one unsharded unit of the folder.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "trainer/interchange/safetensors.h"
#include "trainer/model/llama.h"
#include "trainer/model/model_config.h"

namespace llm {

class PretrainedFolder {
 public:
  // Throws UserError (see above). `log_notes` logs, once, the warnings worth a line (rank 0).
  PretrainedFolder(const std::string& folder, const ModelConfig& model, bool log_notes);

  // Copies the folder's tensors of `unit` into `parameters` (the unit's HF-named parameters, any
  // device and dtype), one tensor read at a time.
  void load_unit(const UnitSpec& unit, const NamedTensors& parameters) const;

  const std::string& folder() const { return folder_; }

 private:
  std::string folder_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> file_of_;  // tensor name -> the file holding it
};

// Opens --init_from when it is set (every rank), else nullptr.
std::unique_ptr<PretrainedFolder> open_init_from(const std::string& folder, const ModelConfig& model, bool log_notes);

}  // namespace llm
