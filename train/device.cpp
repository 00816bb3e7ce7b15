#include "train/device.h"

#include <cstdlib>

#include "core/error.h"

namespace trex::train {

std::string parse_device(const std::string& s, const std::string& where) {
  TREX_USER_CHECK(kern::parse_device_name(s, nullptr), "use cpu, cuda, or cuda:N for CUDA device N (N < 1024)", where,
                  ": unknown device \"", s, "\"");
  return s;
}

std::string rank_device(const std::string& device, const char* local_rank) {
  if (device != "cuda" || !local_rank || !*local_rank) return device;
  for (const char* c = local_rank; *c; ++c)
    if (*c < '0' || *c > '9') return device;
  return "cuda:" + std::string(local_rank);
}

namespace {

const char* launcher_local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) return s;
  return nullptr;
}

}  // namespace

std::unique_ptr<kern::Backend> open_device(const std::string& requested, const std::string& where) {
  parse_device(requested, where);
  if (requested == "cpu") return nullptr;
  const std::string device = rank_device(requested, launcher_local_rank());
  std::unique_ptr<kern::Backend> be;
  try {
    be = kern::make_backend(device);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    if (device != requested)
      TREX_USER_FAIL("start at most one rank per CUDA device on each host, or name one device with cuda:N", where,
                     " = \"", requested, "\" is ", device, " for this rank (its local rank on the host): ", e.what());
    TREX_USER_FAIL("use device \"cpu\"", where, " = \"", device, "\": ", e.what());
  }
  return be;
}

}  // namespace trex::train
