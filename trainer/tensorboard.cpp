#include "trainer/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/crc32c.h"
#include "trainer/tensorboard.pb.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

uint32_t masked_crc(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void append_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

tensorboard::Event event_at(int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(wall_time());
  event.set_step(step);
  return event;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "host";
  return name;
}

}  // namespace

std::string tfrecord(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  append_little_endian(record, data.size(), 8);
  append_little_endian(record, masked_crc(record.data(), 8), 4);
  record.append(data);
  append_little_endian(record, masked_crc(data.data(), data.size()), 4);
  return record;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir, int64_t first_step) {
  refuse_unless_absent_or(dir, OutputKind::folder, "--tensorboard_dir");
  if (const std::error_code error = create_folders_durably(dir))
    throw WriteError(dir, error.message());
  char name[512];
  std::snprintf(name, sizeof(name), "events.out.tfevents.%010lld.%010lld.%s.%d",
                static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count()),
                static_cast<long long>(first_step), host_name().c_str(), static_cast<int>(::getpid()));
  file_.open(dir / name, /*append=*/false);
  tensorboard::Event version = event_at(0);
  version.set_file_version("brain.Event:2");
  write(version.SerializeAsString());
  if (first_step > 1) {
    tensorboard::Event restart = event_at(first_step);
    restart.mutable_session_log()->set_status(tensorboard::SessionLog::START);
    write(restart.SerializeAsString());
  }
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  tensorboard::Event event = event_at(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : values) {
    tensorboard::Summary::Value* entry = summary->add_value();
    entry->set_tag(tag);
    entry->set_simple_value(static_cast<float>(value));
  }
  write(event.SerializeAsString());
}

void TensorBoardWriter::text(const std::string& tag, int64_t step, const std::string& markdown) {
  tensorboard::Event event = event_at(step);
  tensorboard::Summary::Value* entry = event.mutable_summary()->add_value();
  entry->set_tag(tag);
  entry->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tensorboard::TensorProto* tensor = entry->mutable_tensor();
  tensor->set_dtype(tensorboard::DT_STRING);
  tensor->mutable_tensor_shape();  // a scalar: no dimensions
  tensor->add_string_val(markdown);
  write(event.SerializeAsString());
}

void TensorBoardWriter::checkpoint(int64_t step, const std::string& path) {
  tensorboard::Event event = event_at(step);
  event.mutable_session_log()->set_status(tensorboard::SessionLog::CHECKPOINT);
  event.mutable_session_log()->set_checkpoint_path(path);
  write(event.SerializeAsString());
  text("checkpoints", step, "step " + std::to_string(step) + ": `" + path + "`");
}

void TensorBoardWriter::write(const std::string& event) { file_.write_record(tfrecord(event)); }

}  // namespace llm
