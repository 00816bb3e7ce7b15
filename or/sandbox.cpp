#include "or/sandbox.h"
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include "core/error.h"

namespace trex::orx {

namespace {

// ---- helpers usable between fork and exec (no allocation) ----------------------------------
void put(int fd, const char* s) {
  size_t n = std::strlen(s);
  while (n) {
    const ssize_t w = ::write(fd, s, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return;
    }
    s += w, n -= (size_t)w;
  }
}
// A record on the status pipe: "<tag> <what>: <strerror(err)>\n" (err 0: no strerror part).
void record(int fd, char tag, const char* what, int err) {
  char buf[512];
  if (err) std::snprintf(buf, sizeof buf, "%c %s: %s\n", tag, what, std::strerror(err));
  else std::snprintf(buf, sizeof buf, "%c %s\n", tag, what);
  put(fd, buf);
}
bool write_file(const char* path, const char* text) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const size_t n = std::strlen(text);
  const bool ok = ::write(fd, text, n) == (ssize_t)n;
  ::close(fd);
  return ok;
}
// mkdir -p of an absolute path (a copy in a fixed buffer).
bool mkdirs(const char* path) {
  char buf[4096];
  const size_t n = std::strlen(path);
  if (n >= sizeof buf) return false;
  std::memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; ++i)
    if (buf[i] == '/' || buf[i] == 0) {
      const char c = buf[i];
      buf[i] = 0;
      if (::mkdir(buf, 0755) != 0 && errno != EEXIST) return false;
      buf[i] = c;
    }
  return true;
}
// The flags of the mount holding `path` that a read-only remount inside a user namespace must keep.
unsigned long locked_flags(const char* path) {
  struct statvfs s;
  if (::statvfs(path, &s) != 0) return 0;
  unsigned long f = 0;
  if (s.f_flag & ST_NOSUID) f |= MS_NOSUID;
  if (s.f_flag & ST_NODEV) f |= MS_NODEV;
  if (s.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
  if (s.f_flag & ST_NOATIME) f |= MS_NOATIME;
  if (s.f_flag & ST_NODIRATIME) f |= MS_NODIRATIME;
  if (s.f_flag & ST_RELATIME) f |= MS_RELATIME;
  return f;
}

// The CPU time (user + system, all threads; the scheduler's precise count) of process `pid`
// so far, or -1 when it cannot be read (it has ended).
double process_cpu_seconds(pid_t pid) {
  clockid_t c;
  struct timespec ts;
  if (::clock_getcpuclockid(pid, &c) != 0 || ::clock_gettime(c, &ts) != 0) return -1;
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
// Whether the status records (one a line, "<tag> ...") hold one with this tag.
bool has_record(const std::string& status, char tag) {
  for (size_t b = 0; b < status.size();) {
    if (status[b] == tag && b + 1 < status.size() && status[b + 1] == ' ') return true;
    const size_t e = status.find('\n', b);
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return false;
}
double rusage_seconds(const struct rusage& ru) {
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

// Everything the children need, built before fork.
struct Plan {
  std::vector<std::string> argv_s, env_s;
  std::vector<char*> argv, env;
  std::string root, workdir;
  struct Bind {
    std::string src, dst;
    bool link = false;     // src is a symbolic link: recreate it at dst
    std::string target;    // its target
    bool dev = false;      // a device node: bind onto an empty file
  };
  std::vector<Bind> binds;
  std::string tmp_dst, proc_dst, dev_dir;
  SandboxLimits lim;
};

void set_limits(const SandboxLimits& l) {
  auto lim = [](int what, rlim_t v) {
    struct rlimit r = {v, v};
    ::setrlimit(what, &r);
  };
  const rlim_t cpu_soft = (rlim_t)cpu_rlimit_soft(l.cpu_s);
  struct rlimit cpu = {cpu_soft, cpu_soft + 1};  // SIGXCPU at the soft limit, SIGKILL a second later
  ::setrlimit(RLIMIT_CPU, &cpu);
  lim(RLIMIT_AS, (rlim_t)l.memory_bytes);
  lim(RLIMIT_NPROC, (rlim_t)l.processes);
  lim(RLIMIT_FSIZE, (rlim_t)l.file_bytes);
  lim(RLIMIT_NOFILE, (rlim_t)l.open_files);
  lim(RLIMIT_CORE, 0);
}

// Inside the new mount namespace (pid 1 of the new PID namespace): build the read-only view on a
// tmpfs at plan.root and make it the root. Returns false (with a record) when a step is refused;
// the caller then runs without the view.
bool make_view(const Plan& p, int st) {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return record(st, 'W', "mount: make / private", errno), false;
  if (::mount("tmpfs", p.root.c_str(), "tmpfs", MS_NOSUID, "size=16m,mode=755") != 0)
    return record(st, 'W', "mount: tmpfs for the new root", errno), false;
  if (!mkdirs(p.dev_dir.c_str())) return record(st, 'W', "mkdir /dev in the new root", errno), false;
  for (const Plan::Bind& b : p.binds) {
    if (b.link) {
      // the link's folder first (e.g. /bin -> usr/bin: the link at the root)
      if (::symlink(b.target.c_str(), b.dst.c_str()) != 0 && errno != EEXIST) return record(st, 'W', "symlink in the new root", errno), false;
      continue;
    }
    if (b.dev) {
      const int fd = ::open(b.dst.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
      if (fd < 0) return record(st, 'W', "device node placeholder", errno), false;
      ::close(fd);
    } else if (!mkdirs(b.dst.c_str())) {
      return record(st, 'W', "mkdir in the new root", errno), false;
    }
    const char* src = b.src.c_str();
    if (::mount(src, b.dst.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) return record(st, 'W', "bind mount", errno), false;
    if (!b.dev &&
        ::mount(nullptr, b.dst.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | locked_flags(b.dst.c_str()), nullptr) != 0)
      return record(st, 'W', "read-only remount", errno), false;
  }
  if (!mkdirs(p.tmp_dst.c_str())) return record(st, 'W', "mkdir /tmp in the new root", errno), false;
  if (::mount(p.workdir.c_str(), p.tmp_dst.c_str(), nullptr, MS_BIND, nullptr) != 0) return record(st, 'W', "bind the work folder", errno), false;
  if (mkdirs(p.proc_dst.c_str()) && ::mount("proc", p.proc_dst.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
    ::rmdir(p.proc_dst.c_str());  // not permitted here (a masked /proc above us): run without /proc
  if (::chdir(p.root.c_str()) != 0) return record(st, 'W', "chdir to the new root", errno), false;
  if (::syscall(SYS_pivot_root, ".", ".") != 0) return record(st, 'W', "pivot_root", errno), false;
  if (::umount2(".", MNT_DETACH) != 0) return record(st, 'W', "detach the old root", errno), false;
  if (::chdir("/") != 0) return record(st, 'W', "chdir /", errno), false;
  if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID, nullptr) != 0) return record(st, 'W', "read-only new root", errno), false;
  return true;
}

[[noreturn]] void exec_program(const Plan& p, int st) {
  ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  ::execve(p.argv[0], p.argv.data(), const_cast<char* const*>(p.env.data()));
  record(st, 'E', "exec", errno);
  ::_exit(127);
}

// Root is exempt from RLIMIT_NPROC, so a run started by root execs the program as the
// unprivileged uid 65534 (which owns the work folder).
void drop_root(int st) {
  if (::geteuid() != 0) return;
  ::setgroups(0, nullptr);
  if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
    record(st, 'E', "drop to uid 65534", errno);
    ::_exit(125);
  }
}

// Process A: new process group and namespaces (as root: mount, network, PID, IPC, UTS; otherwise
// also a user namespace that maps the caller's ids); then B (pid 1 of the new PID namespace)
// builds the view, starts C (the program: unprivileged, limited), reaps everything and reports
// C's end on the status pipe.
[[noreturn]] void child_main(Plan& p, int out_w, int err_w, int st) {
  ::setpgid(0, 0);
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, 0);
  ::dup2(out_w, 1);
  ::dup2(err_w, 2);
  const bool root = ::geteuid() == 0;
  char uid_map[64], gid_map[64];
  std::snprintf(uid_map, sizeof uid_map, "0 %u 1\n", (unsigned)::geteuid());
  std::snprintf(gid_map, sizeof gid_map, "0 %u 1\n", (unsigned)::getegid());
  const int flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | (root ? 0 : CLONE_NEWUSER);
  if (::unshare(flags) != 0) {
    record(st, 'W', "namespaces refused (unshare)", errno);
    put(st, "I rlimits\n");
    drop_root(st);
    set_limits(p.lim);
    if (::chdir(p.workdir.c_str()) != 0) record(st, 'W', "chdir to the work folder", errno);
    exec_program(p, st);
  }
  if (!root) {  // map our own ids (allowed without privilege): root inside, us outside
    write_file("/proc/self/setgroups", "deny");
    if (!write_file("/proc/self/uid_map", uid_map) || !write_file("/proc/self/gid_map", gid_map))
      record(st, 'W', "user namespace id maps", errno);
  }
  const pid_t b = ::fork();
  if (b < 0) {
    record(st, 'E', "fork", errno);
    ::_exit(125);
  }
  if (b > 0) {  // A: wait for B, exit like it
    int ws = 0;
    while (::waitpid(b, &ws, 0) < 0 && errno == EINTR) {
    }
    ::_exit(WIFEXITED(ws) ? WEXITSTATUS(ws) : 125);
  }
  // B: pid 1 of the namespace.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const bool view = make_view(p, st);
  put(st, view ? "I namespaces\n" : "I namespaces-without-view\n");
  // In the view the work folder is /tmp; without it, the folder itself.
  if (::chdir(view ? "/tmp" : p.workdir.c_str()) != 0) record(st, 'W', "chdir to the work folder", errno);
  const pid_t c = ::fork();
  if (c < 0) {
    record(st, 'E', "fork", errno);
    ::_exit(125);
  }
  if (c == 0) {
    if (root) drop_root(st);  // (not as root of our own user namespace: 65534 is not mapped there)
    set_limits(p.lim);
    exec_program(p, st);
  }
  // Reap every process of the namespace until the program itself ends; every 10 ms read the
  // program's CPU clock and kill it at the limit (recorded first, so the caller knows it was this).
  bool cpu_killed = false;
  for (;;) {
    int ws = 0;
    struct rusage ru = {};
    const pid_t w = ::wait4(-1, &ws, WNOHANG, &ru);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) ::_exit(125);
    if (w == c) {
      char buf[96];
      if (WIFSIGNALED(ws)) std::snprintf(buf, sizeof buf, "K %d %.6f\n", WTERMSIG(ws), rusage_seconds(ru));
      else std::snprintf(buf, sizeof buf, "X %d %.6f\n", WEXITSTATUS(ws), rusage_seconds(ru));
      put(st, buf);
      ::_exit(0);  // pid 1 exits: the kernel kills what the program left behind
    }
    if (w > 0) continue;  // an orphan of the program
    const double used = cpu_killed ? -1 : process_cpu_seconds(c);
    if (used >= p.lim.cpu_s) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "L %.6f\n", used);
      put(st, buf);
      ::kill(c, SIGKILL);
      cpu_killed = true;
    }
    struct timespec nap = {0, 10 * 1000 * 1000};
    ::nanosleep(&nap, nullptr);
  }
}

void drain(int fd, std::string& into, size_t cap) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      if (into.size() < cap) into.append(buf, std::min((size_t)n, cap - into.size()));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return;  // 0: end; EAGAIN: nothing now
  }
}

bool path_exists(const std::string& p, struct stat* st) { return ::lstat(p.c_str(), st) == 0; }

}  // namespace

int64_t cpu_rlimit_soft(double cpu_s) { return (int64_t)std::ceil(1.25 * std::max(cpu_s, 0.0) + 1.0); }

SandboxResult sandbox_run(const std::vector<std::string>& argv, const std::string& workdir,
                          const std::vector<std::string>& env, const std::vector<std::string>& readonly_paths,
                          const SandboxLimits& limits) {
  TREX_CHECK(!argv.empty() && !argv[0].empty() && argv[0][0] == '/', "sandbox_run: argv[0] must be an absolute path");
  SandboxResult r;
  Plan p;
  p.lim = limits;
  p.argv_s = argv;
  p.env_s = env;
  for (auto& s : p.argv_s) p.argv.push_back(s.data());
  p.argv.push_back(nullptr);
  for (auto& s : p.env_s) p.env.push_back(s.data());
  p.env.push_back(nullptr);
  p.workdir = workdir;
  char root_tmpl[] = "/tmp/trex-sandbox-root-XXXXXX";
  TREX_CHECK(::mkdtemp(root_tmpl) != nullptr, "sandbox_run: mkdtemp: ", std::strerror(errno));
  p.root = root_tmpl;
  // The program runs as uid 65534 when started by root: it must own its work folder.
  if (::geteuid() == 0 && ::chown(workdir.c_str(), 65534, 65534) != 0)
    TREX_FAIL("sandbox_run: chown ", workdir, ": ", std::strerror(errno));
  std::vector<std::string> view = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"};
  for (const std::string& x : readonly_paths) view.push_back(x);
  for (const std::string& v : view) {
    struct stat st;
    if (v.empty() || v[0] != '/' || !path_exists(v, &st)) continue;
    Plan::Bind b;
    b.src = v, b.dst = p.root + v;
    if (S_ISLNK(st.st_mode)) {
      char t[4096];
      const ssize_t n = ::readlink(v.c_str(), t, sizeof t - 1);
      if (n <= 0) continue;
      t[n] = 0;
      b.link = true, b.target = t;
    } else if (!S_ISDIR(st.st_mode)) {
      continue;
    }
    p.binds.push_back(b);
  }
  for (const char* d : {"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"}) {
    struct stat st;
    if (!path_exists(d, &st)) continue;
    Plan::Bind b;
    b.src = d, b.dst = p.root + d, b.dev = true;
    p.binds.push_back(b);
  }
  p.dev_dir = p.root + "/dev";
  p.tmp_dst = p.root + "/tmp";
  p.proc_dst = p.root + "/proc";
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // orphans of a fallback run come back to us to be reaped

  int out[2], err[2], st[2];
  TREX_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0 && ::pipe2(st, O_CLOEXEC) == 0,
             "sandbox_run: pipe: ", std::strerror(errno));
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t a = ::fork();
  if (a < 0) {
    for (int fd : {out[0], out[1], err[0], err[1], st[0], st[1]}) ::close(fd);
    ::rmdir(p.root.c_str());
    TREX_FAIL("sandbox_run: fork: ", std::strerror(errno));
  }
  if (a == 0) {
    ::close(out[0]), ::close(err[0]), ::close(st[0]);
    child_main(p, out[1], err[1], st[1]);
  }
  ::setpgid(a, a);  // also from here: no race with a kill before the child ran setpgid
  r.pgid = a;
  ::close(out[1]), ::close(err[1]), ::close(st[1]);
  for (int fd : {out[0], err[0], st[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::string status;
  const auto deadline = t0 + std::chrono::duration<double>(limits.wall_s);
  int ws = 0;
  struct rusage ru = {};
  bool done = false, fallback_cpu_kill = false, wall_kill = false;
  while (!done) {
    struct pollfd fds[3] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}, {st[0], POLLIN, 0}};
    ::poll(fds, 3, 20);
    drain(out[0], r.out, limits.output_bytes);
    drain(err[0], r.err, limits.output_bytes);
    drain(st[0], status, 1 << 16);
    // Seen without reaping: while A is a zombie its pid (the group's id) cannot be reused, so the
    // group kill below cannot reach another process group.
    siginfo_t si = {};
    if (::waitid(P_PID, (id_t)a, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == a) {
      done = true;
    } else if (std::chrono::steady_clock::now() >= deadline && !wall_kill) {
      // A run the CPU monitor already killed (its record came, A has not ended yet) stays a CPU kill.
      wall_kill = true;
      r.wall_timeout = !fallback_cpu_kill && !has_record(status, 'L');
      ::kill(-a, SIGKILL);
      ::kill(a, SIGKILL);
    } else if (!fallback_cpu_kill && !wall_kill && status.find("I rlimits\n") != std::string::npos) {
      // The fallback has no pid 1 of ours: A is the program, and its CPU clock is read here.
      const double used = process_cpu_seconds(a);
      if (used >= limits.cpu_s) {
        fallback_cpu_kill = true;
        r.cpu_monitor_seconds = used;
        ::kill(-a, SIGKILL);
        ::kill(a, SIGKILL);
      }
    }
  }
  // Whatever is left in the group (a fallback run's background processes) is killed, then A and
  // the rest are reaped.
  ::kill(-a, SIGKILL);
  while (::wait4(a, &ws, 0, &ru) < 0 && errno == EINTR) {
  }
  for (int i = 0; i < 200; ++i) {
    while (::waitpid(-a, nullptr, WNOHANG) > 0) {
    }
    if (::kill(-a, 0) != 0 && errno == ESRCH) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  drain(out[0], r.out, limits.output_bytes);
  drain(err[0], r.err, limits.output_bytes);
  drain(st[0], status, 1 << 16);
  for (int fd : {out[0], err[0], st[0]}) ::close(fd);
  ::rmdir(p.root.c_str());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The fallback: A is the program. Else C's own, from its end's record (none after a wall-clock
  // kill, which takes the namespace's init with it: -1, unknown).
  r.cpu_seconds = -1;

  // The status records: I <isolation>, W <note>, E <setup error>, X <exit code> <CPU s>,
  // K <signal> <CPU s>, L <CPU s> (the monitor killed the program at the CPU limit).
  bool ended = false;
  size_t b = 0;
  while (b < status.size()) {
    size_t e = status.find('\n', b);
    if (e == std::string::npos) e = status.size();
    const std::string line = status.substr(b, e - b);
    b = e + 1;
    if (line.size() < 2) continue;
    const std::string rest = line.substr(2);
    switch (line[0]) {
      case 'I': r.isolation = rest; break;
      case 'W': r.message += (r.message.empty() ? "" : "; ") + rest; break;
      case 'E': r.message += (r.message.empty() ? "" : "; ") + rest; r.started = false; ended = true; break;
      case 'X':
      case 'K': {
        char* after = nullptr;
        const long code = std::strtol(rest.c_str(), &after, 10);
        (line[0] == 'X' ? r.exit_code : r.signal) = (int)code;
        r.cpu_seconds = std::strtod(after, nullptr);
        r.started = true, ended = true;
        break;
      }
      case 'L':
        r.cpu_monitor_seconds = std::strtod(rest.c_str(), nullptr);
        r.cpu_by = "monitor";
        break;
    }
  }
  if (fallback_cpu_kill) r.cpu_by = "monitor";
  if (r.isolation == "rlimits") r.cpu_seconds = rusage_seconds(ru);
  if (!ended && r.isolation == "rlimits") {  // fallback: A was the program
    r.started = true;
    if (WIFEXITED(ws)) r.exit_code = WEXITSTATUS(ws);
    else if (WIFSIGNALED(ws)) r.signal = WTERMSIG(ws);
  }
  if (r.wall_timeout) {
    r.started = r.started || !r.isolation.empty();
    if (!r.signal && r.exit_code < 0) r.signal = SIGKILL;
  }
  // Which limit ended the run, from who killed it: the wall clock (our kill), the CPU monitor (its
  // record), the kernel's RLIMIT_CPU soft limit (SIGXCPU). A SIGKILL from anywhere else (the
  // RLIMIT_CPU hard limit of a program that ignored SIGXCPU, the OOM killer) is none of them.
  if (r.wall_timeout) r.cpu_by.clear();
  else if (r.cpu_by.empty() && r.signal == SIGXCPU) r.cpu_by = "SIGXCPU";
  r.cpu_limit = !r.cpu_by.empty();
  return r;
}

}  // namespace trex::orx
