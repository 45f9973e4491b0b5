#include "common/errors.h"

#include <mpi.h>

#include <sstream>

namespace llm {

ProcessIdentity& process_identity() {
  static ProcessIdentity identity;
  return identity;
}

void fail_system_call(const char* call, const char* file, int line, const std::string& detail,
                      const char* hint) {
  const ProcessIdentity& who = process_identity();
  std::ostringstream message;
  message << "rank " << who.rank << " on " << who.host << " (" << who.device << "): " << call
          << " failed at " << file << ":" << line << ": " << detail << ". Hint: " << hint;
  throw SystemError(message.str());
}

void fail_user(const std::string& source, const std::string& key, const std::string& message) {
  std::string text = source;
  if (!key.empty()) text += (text.empty() ? "" : ": ") + key;
  text += (text.empty() ? "" : ": ") + message;
  throw UserError(text);
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

}  // namespace llm
