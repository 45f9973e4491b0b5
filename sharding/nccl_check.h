// LLM_CHECK_NCCL: the NCCL member of the error family in common/errors.h.
//
// Like LLM_CHECK_MPI and LLM_CHECK_CUDA it names rank, host, device, file:line and the failed call,
// then throws llm::SystemError. NCCL's own result string is terse ("invalid usage"), so the detail
// adds ncclGetLastError() (the reason NCCL logged) and the hint depends on the kind of failure:
// most NCCL failures are a mismatch between ranks or a transport problem, and NCCL_DEBUG=INFO is
// the first thing to try for all of them. Only sharding/ includes this header (it needs nccl.h).
#pragma once

#include <nccl.h>

#include <string>

#include "common/errors.h"

namespace llm {

inline const char* nccl_hint(ncclResult_t result) {
  switch (result) {
    case ncclInvalidUsage:
      return "NCCL rejected the call: every rank must call the same collectives in the same order "
             "with the same counts and dtypes, and each rank needs a GPU of its own (NCCL before "
             "2.30 refuses two ranks on one GPU); rerun with NCCL_DEBUG=INFO";
    case ncclInvalidArgument:
      return "a bad argument (null or misaligned buffer, count, root); rerun with NCCL_DEBUG=INFO";
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed; rerun with NCCL_DEBUG=INFO and "
             "CUDA_LAUNCH_BLOCKING=1";
    case ncclSystemError:
      return "an operating-system or network call failed (shared memory, sockets, InfiniBand); "
             "check /dev/shm size and NCCL_SOCKET_IFNAME, rerun with NCCL_DEBUG=INFO";
    case ncclRemoteError:
      return "another rank failed or went away; look at the other ranks' messages first, rerun "
             "with NCCL_DEBUG=INFO";
    default:
      return "rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,COLL) to see why";
  }
}

inline std::string nccl_error_detail(ncclResult_t result) {
  std::string detail = ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') detail += " (" + std::string(last) + ")";
  return detail;
}

}  // namespace llm

#define LLM_CHECK_NCCL(call)                                                                 \
  do {                                                                                       \
    ncclResult_t llm_nccl_status_ = (call);                                                  \
    if (llm_nccl_status_ != ncclSuccess)                                                     \
      ::llm::fail_system_call(#call, __FILE__, __LINE__,                                     \
                              ::llm::nccl_error_detail(llm_nccl_status_),                    \
                              ::llm::nccl_hint(llm_nccl_status_));                           \
  } while (0)
