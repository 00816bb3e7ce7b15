// `trex bench step`'s MFU denominator (cli/peak_choice.h): each branch of choose_peak.
#include <gtest/gtest.h>

#include "cli/peak_choice.h"
#include "core/error.h"

using trex::cli::CalibrationPeak;
using trex::cli::choose_peak;
using trex::cli::PeakChoice;

namespace {
CalibrationPeak cal(double g, int threads = 2) { return {g, threads, "/tmp/cal.json"}; }
}  // namespace

TEST(PeakChoice, FlagOverridesEverything) {
  // Even a low measurement and a calibration do not matter: nothing is compared.
  PeakChoice c = choose_peak({}, cal(185), 100, 2);
  EXPECT_EQ(c.source, "flag");
  EXPECT_EQ(c.gflops, 100);
  EXPECT_EQ(c.measured, 0);
  EXPECT_TRUE(c.warning.empty());
  EXPECT_TRUE(c.note.empty());
  c = choose_peak({96.8, 50}, cal(185), 100, 2);
  EXPECT_EQ(c.source, "flag");
  EXPECT_EQ(c.gflops, 100);
}

TEST(PeakChoice, BestOfTriesWithoutCalibration) {
  PeakChoice c = choose_peak({96.8, 181.5, 150.2}, CalibrationPeak{}, 0, 2);
  EXPECT_EQ(c.source, "measured");
  EXPECT_EQ(c.gflops, 181.5);
  EXPECT_EQ(c.measured, 181.5);
  EXPECT_TRUE(c.warning.empty());
  // No calibration: a low measurement stays (nothing to compare against).
  c = choose_peak({96.8}, CalibrationPeak{}, 0, 2);
  EXPECT_EQ(c.source, "measured");
  EXPECT_EQ(c.gflops, 96.8);
}

TEST(PeakChoice, MeasuredAtOrAboveEightyPercentIsKept) {
  // 150 >= 0.8 x 185 = 148: the measurement is plausible, kept even though below the file's.
  PeakChoice c = choose_peak({120, 150}, cal(185), 0, 2);
  EXPECT_EQ(c.source, "measured");
  EXPECT_EQ(c.gflops, 150);
  EXPECT_TRUE(c.warning.empty());
  // Exactly at the threshold is not low.
  c = choose_peak({148}, cal(185), 0, 2);
  EXPECT_EQ(c.source, "measured");
  // Above the file's peak: the measurement.
  c = choose_peak({190}, cal(185), 0, 2);
  EXPECT_EQ(c.source, "measured");
  EXPECT_EQ(c.gflops, 190);
}

TEST(PeakChoice, LowMeasurementFallsBackToCalibrationWithWarning) {
  // The case of issue 8: 96.8 measured on a busy machine whose calibration says 185.
  PeakChoice c = choose_peak({96.8, 91.0, 96.7}, cal(185), 0, 2);
  EXPECT_EQ(c.source, "calibration");
  EXPECT_EQ(c.gflops, 185);
  EXPECT_EQ(c.measured, 96.8);
  EXPECT_NE(c.warning.find("96.8"), std::string::npos) << c.warning;
  EXPECT_NE(c.warning.find("185.0"), std::string::npos) << c.warning;
  EXPECT_NE(c.warning.find("/tmp/cal.json"), std::string::npos) << c.warning;
  EXPECT_NE(c.warning.find("3 tries"), std::string::npos) << c.warning;
  EXPECT_TRUE(c.note.empty());
  // Calibration without a thread count (hand-written file): still compared.
  c = choose_peak({96.8}, cal(185, 0), 0, 2);
  EXPECT_EQ(c.source, "calibration");
}

TEST(PeakChoice, CalibrationAtOtherThreadCountIsNotCompared) {
  // Measured at 4 threads (e.g. 2 ranks x 2) while this run uses 2: its peak is not this run's.
  PeakChoice c = choose_peak({96.8}, cal(370, 4), 0, 2);
  EXPECT_EQ(c.source, "measured");
  EXPECT_EQ(c.gflops, 96.8);
  EXPECT_TRUE(c.warning.empty());
  EXPECT_NE(c.note.find("4 threads"), std::string::npos) << c.note;
  EXPECT_NE(c.note.find("this run has 2"), std::string::npos) << c.note;
}

TEST(PeakChoice, NoTriesAndNoFlagIsABug) {
  EXPECT_THROW(choose_peak({}, cal(185), 0, 2), std::exception);
  EXPECT_THROW(choose_peak({-1.0}, cal(185), 0, 2), std::exception);
}

// MFU above 100% names the peak that made it so; none at or below 100%.
TEST(PeakChoice, MfuAboveOneIsFlagged) {
  const PeakChoice m = choose_peak({230.0}, cal(0), 0, 2);
  EXPECT_TRUE(implausible_mfu(0.69, m).empty());
  EXPECT_TRUE(implausible_mfu(1.0, m).empty());
  const std::string w = implausible_mfu(1.353, m);
  EXPECT_NE(w.find("135.3%"), std::string::npos) << w;
  EXPECT_NE(w.find("measured peak 230.0"), std::string::npos) << w;
  EXPECT_NE(w.find("trex bench calibrate"), std::string::npos) << w;
  const std::string f = implausible_mfu(1.2, choose_peak({}, cal(0), 100, 2));
  EXPECT_NE(f.find("--peak-gflops 100.0"), std::string::npos) << f;
}
