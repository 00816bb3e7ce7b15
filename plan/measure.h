// Measures this machine for the planner's "cpu-this" spec: FMA / bf16-dot peaks, memory size
// and bandwidth, and the efficiency of the op classes the planner models (dense GEMM, grouped
// expert GEMM, attention forward + backward, a memory-bound op), each against the peak the
// corresponding trex kernel runs on. `trex bench calibrate` writes the result as JSON.
#pragma once
#include <functional>
#include "plan/calibration.h"

namespace trex::plan {

// Median time (ms) of fn over at least 5 runs filling about `seconds`, after one warm-up run: a
// step's ops run at their typical speed, and on a shared machine the best run is an outlier.
double median_ms(const std::function<void()>& fn, double seconds);
// Memory bandwidth (GB/s): a threaded triad d = a + 0.5 b over 3 x 128 MB (12 bytes per element),
// median of runs filling about `seconds`; the mem_bw_gbs of measure_calibration.
double triad_gbs(double seconds);

// seconds: rough time budget per measurement.
Calibration measure_calibration(double seconds = 1.5);

}  // namespace trex::plan
