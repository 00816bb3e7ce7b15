#include "train/device.h"

#include "core/error.h"

namespace trex::train {

std::string parse_device(const std::string& s, const std::string& where) {
  TREX_USER_CHECK(kern::parse_device_name(s, nullptr), "use cpu, cuda, or cuda:N for CUDA device N (N < 1024)", where,
                  ": unknown device \"", s, "\"");
  return s;
}

std::unique_ptr<kern::Backend> open_device(const std::string& device, const std::string& where) {
  parse_device(device, where);
  if (device == "cpu") return nullptr;
  std::unique_ptr<kern::Backend> be;
  try {
    be = kern::make_backend(device);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    TREX_USER_FAIL("use device \"cpu\"", where, " = \"", device, "\": ", e.what());
  }
  return be;
}

}  // namespace trex::train
