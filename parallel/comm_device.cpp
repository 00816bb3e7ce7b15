// The device communicator of a backend. See comm_device.h.
#include "parallel/comm_device.h"

#include <cstdlib>
#include <string>
#include "core/error.h"
#include "parallel/comm_staged.h"
#if TREX_WITH_NCCL
#include "parallel/comm_nccl.h"
#endif

namespace trex::parallel {

std::unique_ptr<Communicator> make_device_comm(Communicator& host, kern::Backend& be) {
  if (be.host_addressable()) return nullptr;
  const char* env = std::getenv("TREX_DEVICE_COMM");
  const std::string choice = env ? env : "";
  TREX_USER_CHECK(choice.empty() || choice == "staged" || choice == "native",
                  "set TREX_DEVICE_COMM to staged or native, or leave it unset", "TREX_DEVICE_COMM=", choice,
                  " is not a device communicator");
#if TREX_WITH_NCCL
  if (std::string(be.name()) == "cuda" && choice != "staged") return make_nccl_comm(host, be.stream());
#endif
  return std::make_unique<StagedComm>(host, be);
}

}  // namespace trex::parallel
