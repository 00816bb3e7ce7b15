// The MFU denominator of `trex bench step` (issue 8, peak measurement robustness): a pure choice
// between the peak measured right after the steps, the peak a calibration file stores for this
// machine (`trex bench calibrate`) and the --peak-gflops flag. Header-only so the unit test
// (tests/unit/test_peak_choice.cpp) needs no CLI sources.
//   flag > 0                          -> the flag, nothing measured or compared ("flag")
//   best of the measured tries        -> "measured", unless a comparable calibration exists and
//     the best try is below kLowFraction of its peak: then the calibration's peak ("calibration")
//     and a warning naming both figures (a low measurement on a shared machine would inflate MFU).
// The calibration is comparable when it was measured with the same total thread count as this
// run (calibration threads x ranks_per_node == run threads x ranks); otherwise it is ignored and
// `note` says why (peaks scale with the cores in use).
#pragma once
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>
#include "core/error.h"

namespace trex::cli {

struct CalibrationPeak {
  double gflops = 0;  // the stored peak for this run's precision; <= 0: no calibration file
  int threads = 0;    // the calibration's total threads (threads x ranks_per_node); 0: unknown
  std::string path;   // for the messages
};

struct PeakChoice {
  double gflops = 0;    // the peak to compute MFU against
  std::string source;   // "measured" | "calibration" | "flag"
  double measured = 0;  // best of the tries (0 when the flag was given)
  std::string warning;  // non-empty: print on stderr (the measurement was low)
  std::string note;     // non-empty: the calibration was not used, and why
};

// Below this fraction of the calibration's peak a measurement is taken for noise.
constexpr double kLowPeakFraction = 0.8;

// tries: the measured peaks (GFLOP/s, whole machine), empty when flag > 0; run_threads: the total
// threads of this run (threads per rank x ranks).
inline PeakChoice choose_peak(const std::vector<double>& tries, const CalibrationPeak& cal, double flag,
                              int run_threads) {
  PeakChoice c;
  if (flag > 0) {
    c.gflops = flag;
    c.source = "flag";
    return c;
  }
  TREX_CHECK(!tries.empty(), "choose_peak: no measured tries and no --peak-gflops");
  for (double t : tries) TREX_CHECK(t >= 0, "choose_peak: negative measured peak ", t);
  c.measured = *std::max_element(tries.begin(), tries.end());
  c.gflops = c.measured;
  c.source = "measured";
  if (cal.gflops <= 0) return c;
  char buf[512];
  if (cal.threads > 0 && cal.threads != run_threads) {
    std::snprintf(buf, sizeof buf, "calibration %s (%.1f GFLOP/s) measured %d threads, this run has %d: not compared",
                  cal.path.c_str(), cal.gflops, cal.threads, run_threads);
    c.note = buf;
    return c;
  }
  if (c.measured < kLowPeakFraction * cal.gflops) {
    std::snprintf(buf, sizeof buf,
                  "measured peak %.1f GFLOP/s (best of %zu tries) is below %.0f%% of the calibration's %.1f GFLOP/s "
                  "(%s), taken for a busy machine: MFU uses the calibration's %.1f",
                  c.measured, tries.size(), 100 * kLowPeakFraction, cal.gflops, cal.path.c_str(), cal.gflops);
    c.warning = buf;
    c.gflops = cal.gflops;
    c.source = "calibration";
  }
  return c;
}

// A step cannot beat the machine's peak: an MFU above 1 means the peak it was divided by is too
// low (measured while other processes took the cores, or a --peak-gflops below the machine's).
// Returns the warning to print (empty when mfu <= 1).
inline std::string implausible_mfu(double mfu, const PeakChoice& c) {
  if (!(mfu > 1.0)) return {};
  char buf[512];
  if (c.source == "flag")
    std::snprintf(buf, sizeof buf, "MFU %.1f%% is above 100%%: --peak-gflops %.1f is below what this step reached",
                  100 * mfu, c.gflops);
  else
    std::snprintf(buf, sizeof buf,
                  "MFU %.1f%% is above 100%%: the %s peak %.1f GFLOP/s is too low (the machine was busy while it "
                  "was measured); run `trex bench calibrate` on a quiet machine or pass --peak-gflops",
                  100 * mfu, c.source.c_str(), c.gflops);
  return buf;
}

}  // namespace trex::cli
