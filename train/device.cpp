#include "train/device.h"

#include "core/error.h"

namespace trex::train {

std::string parse_device(const std::string& s, const std::string& where) {
  bool ok = s == "cpu" || s == "cuda";
  if (!ok && s.rfind("cuda:", 0) == 0 && s.size() > 5) {
    ok = s.size() <= 9;
    for (size_t i = 5; i < s.size(); ++i) ok &= s[i] >= '0' && s[i] <= '9';
  }
  TREX_USER_CHECK(ok, "use cpu, cuda, or cuda:N for CUDA device N", where, ": unknown device \"", s, "\"");
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
  // The same condition as model::Model::use_backend, asked before the run loads anything.
  TREX_USER_CHECK(be->host_addressable(), "use device \"cpu\"", where, " = \"", device, "\" (", be->describe(),
                  "): the training step does not run on the ", be->name(),
                  " backend yet (its kernels do: trex_cuda_ops); the model's parameters, activations, routing "
                  "and row copies live in host memory");
  return be;
}

}  // namespace trex::train
