// This host's memory as a process sees it: physical, available now, and the process's own peak.
// Read by trex train's start-up memory check (train/preflight.h) and by `trex bench calibrate`
// (plan/measure.h), so that the planner's cpu-this device and the check count the same bytes.
#pragma once

namespace trex {

// The rest of a training process, outside its weights, gradients, optimizer state, activations and
// buffers: the runtime libraries (oneDNN, OpenMP, MPI), thread stacks, the kernels' per-thread
// scratch and the heap (RELIABILITY.md: at most 0.3 GiB measured on the bench configs up to 65536
// tokens). trex train's start-up check adds it (train/preflight.h); `trex plan` reserves it on
// cpu-this (plan/calibration.cpp).
inline constexpr double kRuntimeBytes = 512.0 * 1024 * 1024;

// Physical memory of this machine as this process sees it: min(MemTotal, cgroup v2 memory.max /
// v1 memory.limit_in_bytes); 0 if unknown.
double machine_memory_bytes();

// Memory a new allocation can take now without swapping: MemAvailable (free memory and the
// reclaimable caches; the kernel and other processes hold the rest), at most
// machine_memory_bytes(); machine_memory_bytes() where MemAvailable is unknown.
double available_memory_bytes();

// Peak resident set of this process so far (getrusage), bytes.
double peak_rss_bytes();

}  // namespace trex
