#include "core/trace.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include "core/error.h"

namespace trex {

namespace {

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if ((unsigned char)c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", (unsigned)c);
      o += b;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

}  // namespace

void write_trace_part(const TraceLog& log, int rank, const std::string& path) {
  std::ofstream f(path);
  TREX_USER_CHECK(f.good(), "give --trace a path in a writable directory", "trace file '", path, "': cannot write");
  char b[256];
  std::snprintf(b, sizeof b, "{\"ph\": \"M\", \"pid\": %d, \"name\": \"process_name\", \"args\": {\"name\": \"rank %d\"}}\n",
                rank, rank);
  f << b;
  for (int t = 0; t < 2; ++t) {
    std::snprintf(b, sizeof b,
                  "{\"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"name\": \"thread_name\", \"args\": {\"name\": \"%s\"}}\n",
                  rank, t, t == 0 ? "compute" : "communication");
    f << b;
  }
  for (const TraceEvent& e : log.events()) {
    std::snprintf(b, sizeof b, "\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f", rank,
                  (int)e.track, e.t0_ms * 1e3, (e.t1_ms - e.t0_ms) * 1e3);
    f << "{\"name\": " << json_string(e.name) << ", \"cat\": \"" << (e.track == TraceTrack::Compute ? "compute" : "comm")
      << "\", " << b << "}\n";
  }
  f.close();
  TREX_USER_CHECK(f.good(), "check free space where --trace points", "trace file '", path, "': write failed");
}

size_t merge_trace_parts(const std::vector<std::string>& parts, const std::string& out) {
  std::ofstream o(out);
  TREX_USER_CHECK(o.good(), "give --trace a path in a writable directory", "trace file '", out, "': cannot write");
  o << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  size_t n = 0;
  for (const std::string& p : parts) {
    std::ifstream f(p);
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      o << (n++ ? ",\n" : "") << line;
    }
  }
  o << "\n]}\n";
  o.close();
  TREX_USER_CHECK(o.good(), "check free space where --trace points", "trace file '", out, "': write failed");
  return n;
}

}  // namespace trex
