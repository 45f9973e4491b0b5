// One error family for the whole trainer.
//
// Two kinds of failure exist and they are kept apart:
//  * UserError: bad input (config, flags, data, checkpoint). The message says what was wrong and
//    what to do; main() prints it once and exits with status 2. It never becomes a crash or a hang.
//  * A failed CUDA, NCCL or MPI call: LLM_CHECK_* names rank, host, device, file:line, the failed
//    call and a hint, then throws SystemError; main() prints it and aborts the whole MPI job so no
//    other rank waits forever on a collective.
#pragma once

#include <stdexcept>
#include <string>

namespace llm {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class SystemError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Training itself went wrong (a NaN or inf loss): the message says at which step and what to try.
class TrainingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Who this process is, for error messages and log prefixes. Filled once by the launcher.
struct ProcessIdentity {
  int rank = 0;
  int world_size = 1;
  std::string host = "localhost";
  std::string device = "cpu";
};
ProcessIdentity& process_identity();

// Formats "rank R on HOST (DEVICE): CALL failed at FILE:LINE: DETAIL. Hint: HINT" and throws.
[[noreturn]] void fail_system_call(const char* call, const char* file, int line,
                                   const std::string& detail, const char* hint);

// The source of every error about the command line's flags: "command line: --flag: ...".
inline constexpr const char* kCommandLine = "command line";

// Throws UserError with "SOURCE: KEY: MESSAGE" (source is a file or a flag group).
[[noreturn]] void fail_user(const std::string& source, const std::string& key,
                            const std::string& message);

std::string mpi_error_string(int code);

}  // namespace llm

#define LLM_CHECK_MPI(call)                                                                  \
  do {                                                                                       \
    int llm_mpi_status_ = (call);                                                            \
    if (llm_mpi_status_ != 0)                                                                \
      ::llm::fail_system_call(#call, __FILE__, __LINE__,                                     \
                              ::llm::mpi_error_string(llm_mpi_status_),                      \
                              "check that every rank reached the same collective");          \
  } while (0)

#ifdef TRAINER_HAVE_CUDA
#include <cuda_runtime_api.h>
#define LLM_CHECK_CUDA(call)                                                                 \
  do {                                                                                       \
    cudaError_t llm_cuda_status_ = (call);                                                   \
    if (llm_cuda_status_ != cudaSuccess)                                                     \
      ::llm::fail_system_call(#call, __FILE__, __LINE__,                                     \
                              cudaGetErrorString(llm_cuda_status_),                          \
                              "run with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel"); \
  } while (0)
#endif

// A user-facing precondition: LLM_REQUIRE(cond, source, key, message-stream-expression).
#define LLM_REQUIRE(cond, source, key, message)                                              \
  do {                                                                                       \
    if (!(cond)) ::llm::fail_user((source), (key), (message));                               \
  } while (0)
