# The CUDA backend: kernels/cuda/*.cu as the static library trex_cuda (cuBLASLt + trex's
# kernels), and trex_cuda_ops, the op harness that runs every CUDA kernel against the CPU
# reference (tests/ops_cuda/; CTest ops_cuda, reported as skipped where no CUDA device exists).
# Architectures: Hopper (sm_90) unless CMAKE_CUDA_ARCHITECTURES says otherwise, e.g.
# -DCMAKE_CUDA_ARCHITECTURES="80;90" for A100s as well.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
# CXX_STANDARD 20 + REQUIRED makes CMake ask for the CUDA20 dialect, whose nvcc flag CMake < 3.26
# does not know (error "requires the language dialect CUDA20"): tell it.
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

file(GLOB TREX_CUDA_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)
add_library(trex_cuda STATIC ${TREX_CUDA_SRC})
# The directory-wide host flags (-Wall ...) in their nvcc form.
set_property(TARGET trex_cuda PROPERTY COMPILE_OPTIONS "-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter")
set_property(TARGET trex_cuda PROPERTY CUDA_STANDARD 20)
target_include_directories(trex_cuda PUBLIC ${CMAKE_SOURCE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(trex_cuda PUBLIC CUDA::cudart CUDA::cublasLt)

function(trex_cuda_ops_target)
  file(GLOB src CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/ops_cuda/*.cpp)
  add_executable(trex_cuda_ops ${src} ${CMAKE_SOURCE_DIR}/tests/ops/harness.cpp)
  target_link_libraries(trex_cuda_ops PRIVATE trex_cuda)
  # Exit code 77: no CUDA device here; CTest reports the test as skipped, not passed.
  add_test(NAME ops_cuda COMMAND trex_cuda_ops test)
  set_tests_properties(ops_cuda PROPERTIES SKIP_RETURN_CODE 77)
endfunction()

if(TREX_CUDA_ONLY)
  enable_testing()
  trex_cuda_ops_target()
endif()
