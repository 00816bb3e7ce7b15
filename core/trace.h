// A timeline of named intervals, written as a Chrome trace (opens in Perfetto / chrome://tracing).
// Owned by the caller and passed down explicitly, like Profiler (null = off). Tracks: Compute (the
// step's profiler regions and the waits on communication, on the thread that runs them) and Comm
// (each collective from its launch until it was seen complete). Times are steady-clock
// milliseconds (core/timer.h): one clock for every process of a node, so ranks line up.
#pragma once
#include <string>
#include <vector>

namespace trex {

enum class TraceTrack { Compute = 0, Comm = 1 };

struct TraceEvent {
  std::string name;
  TraceTrack track = TraceTrack::Compute;
  double t0_ms = 0, t1_ms = 0;
};

class TraceLog {
 public:
  void add(std::string name, TraceTrack track, double t0_ms, double t1_ms) {
    events_.push_back({std::move(name), track, t0_ms, t1_ms});
  }
  const std::vector<TraceEvent>& events() const { return events_; }
  void clear() { events_.clear(); }

 private:
  std::vector<TraceEvent> events_;
};

// Writes `log` as the trace events of process `rank` (pid = rank; tid 0 compute, 1 communication;
// with process and thread names), one JSON object per line, to `path`. Throws trex::Error naming
// the path when it cannot be written.
void write_trace_part(const TraceLog& log, int rank, const std::string& path);
// Joins part files written by write_trace_part into one Chrome trace file {"traceEvents": [...]}
// at `out`; parts that do not exist are skipped (another node's). Returns the events written.
size_t merge_trace_parts(const std::vector<std::string>& parts, const std::string& out);

}  // namespace trex
