// Measures this machine for the planner's "cpu-this" spec: FMA / bf16-dot peaks, memory size
// and bandwidth, and the efficiency of the op classes the planner models (dense GEMM, grouped
// expert GEMM, attention forward + backward, a memory-bound op), each against the peak the
// corresponding trex kernel runs on. `trex bench calibrate` writes the result as JSON.
#pragma once
#include "plan/calibration.h"

namespace trex::plan {

// seconds: rough time budget per measurement.
Calibration measure_calibration(double seconds = 1.5);

}  // namespace trex::plan
