// make_cuda_backend in a build without the CUDA backend (CMake TREX_CUDA=OFF, or no nvcc found).
#include "core/error.h"
#include "kernels/backend.h"

namespace trex::kern {

bool cuda_available(std::string* why) {
  if (why) *why = "this trex was built without the CUDA backend (configure with -DTREX_CUDA=ON where nvcc exists)";
  return false;
}

std::unique_ptr<Backend> make_cuda_backend(int) {
  std::string why;
  cuda_available(&why);
  throw Error("cuda backend: " + why);
}

}  // namespace trex::kern
