// This host's memory. See host_memory.h.
#include "core/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>
#include <algorithm>
#include <fstream>
#include <string>

namespace trex {

namespace {

// A number from the first line of a file, or -1.
double read_number(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return -1;
  try {
    return std::stod(s);
  } catch (...) {
    return -1;
  }
}

double meminfo_bytes(const std::string& field) {  // a /proc/meminfo field ("MemTotal:"), or -1
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  double kb;
  while (f >> key >> kb >> unit)
    if (key == field) return kb * 1024;
  return -1;
}

}  // namespace

double machine_memory_bytes() {
  double total = meminfo_bytes("MemTotal:");
  if (total <= 0) total = (double)::sysconf(_SC_PHYS_PAGES) * (double)::sysconf(_SC_PAGESIZE);
  for (const char* p : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const double lim = read_number(p);
    if (lim > 0 && lim < total) total = lim;
  }
  return std::max(total, 0.0);
}

double available_memory_bytes() {
  const double total = machine_memory_bytes(), avail = meminfo_bytes("MemAvailable:");
  if (avail <= 0) return total;
  return std::clamp(avail, 0.0, total);
}

double peak_rss_bytes() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_maxrss * 1024.0;  // Linux: kilobytes
}

}  // namespace trex
