// Runs an untrusted program (a model-written solver script) contained:
//   - its own process group, and (where user namespaces are allowed) its own user, network, mount
//     and PID namespaces: no network (a new network namespace whose only interface, loopback, stays
//     down), the process is pid 1's child in a fresh PID namespace (when it ends, every process it
//     left behind is killed by the kernel, even one that left the process group);
//   - a read-only view of the filesystem made of the system folders (/usr /bin /sbin /lib /lib32
//     /lib64 /etc), a few device nodes and the caller's extra read-only paths (the Python
//     installation), with the work folder as the only writable place, seen at /tmp and as the
//     working directory; everything else (home folders, the data, other temporary files) is absent;
//   - a CPU-time limit on the program's process, kept by a monitor that reads its CPU clock (the
//     scheduler's precise time, all its threads) every 10 ms and kills it at the limit;
//   - rlimits: CPU seconds as a backstop for every process the program starts (below), address
//     space, processes (RLIMIT_NPROC, set inside the new user namespace, so it counts only this
//     run's processes), file size, open files, no core files;
//   - a wall-clock limit after which the whole process group (and the PID namespace) is killed.
// Which limit ended a run is known, not guessed: the wall clock (the caller's own kill), the CPU
// monitor (its record of the CPU time it read), or the kernel's RLIMIT_CPU soft limit (the
// program died of SIGXCPU). RLIMIT_CPU alone could not say it: the kernel counts it on a
// tick-sampled clock that runs ahead of the precise one on a loaded machine (a 2 s limit measured
// killing at 1.73-2.00 s of precise CPU time), and with soft = hard its kill is a plain SIGKILL.
// Where the kernel refuses namespaces, the run falls back to the process group + rlimits (and, as
// root, the unprivileged uid 65534 so that RLIMIT_NPROC applies); SandboxResult::isolation says
// which, so a caller can report it. The sandbox contains; it does not stop a program from faking
// its own result.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace trex::orx {

struct SandboxLimits {
  double wall_s = 60;                     // wall clock; the process group is killed after it
  double cpu_s = 30;                      // CPU seconds of the program's process (the monitor kills it
                                          // there); RLIMIT_CPU of each of its processes: soft
                                          // cpu_rlimit_soft(cpu_s) (SIGXCPU), hard one second more
  int64_t memory_bytes = 4ll << 30;       // RLIMIT_AS
  int64_t processes = 64;                 // RLIMIT_NPROC
  int64_t file_bytes = 64ll << 20;        // RLIMIT_FSIZE
  int64_t open_files = 256;               // RLIMIT_NOFILE
  size_t output_bytes = 1 << 20;          // stdout / stderr kept (each); the rest is dropped
};

struct SandboxResult {
  bool started = false;        // the program was exec'd (false: setup failed, see message)
  int exit_code = -1;          // exited normally: its status; else -1
  int signal = 0;              // killed by this signal (SIGKILL for limits)
  bool wall_timeout = false;   // the wall-clock limit killed it (the caller's own kill)
  bool cpu_limit = false;      // the CPU-time limit ended it: cpu_by says how
  std::string cpu_by;          // "monitor" (read cpu_monitor_seconds >= cpu_s, then SIGKILL) |
                               // "SIGXCPU" (the kernel's RLIMIT_CPU soft limit) | ""
  double cpu_monitor_seconds = 0;  // cpu_by "monitor": the CPU time the monitor read before its kill
  double seconds = 0;          // wall time
  double cpu_seconds = -1;     // user + system time of the program's process (wait4 rusage, with
                               // its reaped children); -1: unknown (namespaces, wall-clock kill)
  std::string out, err;        // captured stdout / stderr (first output_bytes each)
  std::string isolation;       // "namespaces" (user+net+mount+pid) or "rlimits" (fallback)
  std::string message;         // setup failure or fallback reason
  int pgid = 0;                // the process group the run had (gone when run() returns)
};

// RLIMIT_CPU's soft limit for a CPU limit of cpu_s: far enough above it (1.25 cpu_s + 1, rounded
// up) that the monitor, on the precise clock, normally acts first.
int64_t cpu_rlimit_soft(double cpu_s);

// Runs argv[0] (an absolute path) with argv, in `workdir` (created by the caller, writable),
// environment `env` ("K=V" entries), and `readonly_paths` added to the view. Blocks until the
// program and everything it started are gone.
SandboxResult sandbox_run(const std::vector<std::string>& argv, const std::string& workdir,
                          const std::vector<std::string>& env, const std::vector<std::string>& readonly_paths,
                          const SandboxLimits& limits);

}  // namespace trex::orx
