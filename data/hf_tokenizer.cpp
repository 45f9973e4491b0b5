#include "data/hf_tokenizer.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/errors.h"
#include "data/python_helper.h"

namespace llm {
namespace fs = std::filesystem;

namespace {

uint32_t load_u32(const unsigned char* bytes) {
  uint32_t value = 0;
  std::memcpy(&value, bytes, 4);
  return value;
}

}  // namespace

bool is_hf_tokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  while (in.get(c))
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return c == '{';
  return false;
}

HfTokenizer::HfTokenizer(const std::string& path) : path_(path) {
  const std::string python = project_python(), script = project_script("data/hf_encode.py");
  LLM_REQUIRE(fs::exists(script), path, "--tokenizer",
              "a tokenizer.json is encoded by " + script + ", which is missing; run the trainer from its source tree");
  int down[2], up[2];
  LLM_REQUIRE(::pipe(down) == 0 && ::pipe(up) == 0, path, "--tokenizer", "cannot make a pipe to the encoder (" +
                                                                               std::string(std::strerror(errno)) + ")");
  std::string why;
  child_ = spawn_helper({python, script, path}, down[0], up[1], -1, {down[1], up[0]}, &why);
  ::close(down[0]);
  ::close(up[1]);
  to_child_ = down[1];
  from_child_ = up[0];
  if (child_ < 0)
    fail_user(path, "--tokenizer", "cannot start " + python + " to encode with the tokenizers library (" + why +
                                       "); set TRAINER_PYTHON to the project's Python");
  ::signal(SIGPIPE, SIG_IGN);  // a helper that died is a failed write, said below, not a killed trainer
  unsigned char handshake[12];
  std::string failure;
  try {
    read_all(handshake, 4);
    if (std::memcmp(handshake, "HFER", 4) == 0) {
      read_all(handshake + 4, 4);
      failure.resize(load_u32(handshake + 4));
      read_all(failure.data(), failure.size());
    } else {
      LLM_REQUIRE(std::memcmp(handshake, "HFOK", 4) == 0, path, "--tokenizer", "the encoder answered nonsense");
      read_all(handshake + 4, 8);
    }
  } catch (const UserError&) {
    failure = "the encoder (" + python + " " + script + ") stopped before answering; is " + python + " a Python?";
  }
  if (!failure.empty()) fail_user(path, "--tokenizer", failure);
  vocab_size_ = load_u32(handshake + 4);
  int32_t eos = 0;
  std::memcpy(&eos, handshake + 8, 4);
  end_of_document_ = eos;
}

HfTokenizer::~HfTokenizer() {
  if (to_child_ >= 0) {
    const uint32_t end = 0;
    [[maybe_unused]] const ssize_t written = ::write(to_child_, &end, 4);
    ::close(to_child_);
  }
  if (from_child_ >= 0) ::close(from_child_);
  if (child_ > 0) {
    int status = 0;
    ::waitpid(child_, &status, 0);
  }
}

void HfTokenizer::write_all(const void* data, size_t bytes) {
  const auto* at = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t written = ::write(to_child_, at, bytes);
    if (written < 0 && errno == EINTR) continue;
    LLM_REQUIRE(written > 0, path_, "--tokenizer", "the encoder stopped taking text (" + std::string(std::strerror(errno)) + ")");
    at += written;
    bytes -= static_cast<size_t>(written);
  }
}

void HfTokenizer::read_all(void* data, size_t bytes) {
  auto* at = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t got = ::read(from_child_, at, bytes);
    if (got < 0 && errno == EINTR) continue;
    LLM_REQUIRE(got > 0, path_, "--tokenizer", "the encoder stopped before answering (it printed why above, if it could)");
    at += got;
    bytes -= static_cast<size_t>(got);
  }
}

std::vector<std::vector<int>> HfTokenizer::encode(const std::vector<std::string>& texts) {
  std::vector<std::vector<int>> ids(texts.size());
  if (texts.empty()) return ids;
  // The whole batch goes down before any answer is read: the helper reads it all first.
  std::string message;
  const auto count = static_cast<uint32_t>(texts.size());
  message.append(reinterpret_cast<const char*>(&count), 4);
  for (const std::string& text : texts) {
    const auto size = static_cast<uint32_t>(text.size());
    message.append(reinterpret_cast<const char*>(&size), 4);
    message += text;
  }
  write_all(message.data(), message.size());
  for (std::vector<int>& row : ids) {
    uint32_t n = 0;
    read_all(&n, 4);
    std::vector<uint32_t> values(n);
    if (n > 0) read_all(values.data(), n * sizeof(uint32_t));
    row.assign(values.begin(), values.end());
  }
  return ids;
}

}  // namespace llm
