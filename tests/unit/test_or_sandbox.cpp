// The sandbox (or/sandbox.h) and the Python solver-code judge (or/code_judge.h) against hostile
// programs: a fork bomb, an infinite loop, a 10 GB allocation, a write outside the work folder, a
// connection to a listener on 127.0.0.1, a read of a file outside the view. Each is contained,
// reported with its failure kind, leaves no process of its group behind, and evaluate() goes on
// to the next problem. Skipped (with the reason) where no Python interpreter is found.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include "or/code_judge.h"
#include "or/judge.h"
#include "or/sandbox.h"

namespace fs = std::filesystem;
using namespace trex::orx;

namespace {

const PythonEnv& python() {
  static const PythonEnv py = find_python("");
  return py;
}
bool has_module(const char* m) {
  if (!python().ok) return false;
  const std::string cmd = "'" + python().python + "' -c 'import " + m + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}
#define NEED_PYTHON() \
  if (!python().ok) GTEST_SKIP() << "no Python interpreter: " << python().why
#define NEED_MODULE(m) \
  if (!has_module(m)) GTEST_SKIP() << "Python module " m " is not installed (scripts/setup_orpy.sh installs it)"

SandboxLimits small_limits() {
  SandboxLimits l;
  l.wall_s = 6;
  l.cpu_s = 2;
  l.memory_bytes = 1ll << 30;
  l.processes = 16;
  return l;
}
bool group_gone(int pgid) { return pgid > 0 && ::kill(-pgid, 0) != 0 && errno == ESRCH; }

struct TmpDir {
  fs::path p;
  TmpDir() {
    char t[] = "/tmp/trex-sandbox-test-XXXXXX";
    p = ::mkdtemp(t);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(p, ec);
  }
};

}  // namespace

TEST(OrSandbox, PlainRunAndIsolation) {
  NEED_PYTHON();
  TmpDir work;
  SandboxResult r = sandbox_run({python().python, "-c", "import os; print('hi', os.getcwd()); open('f.txt','w').write('x')"},
                                work.p.string(), {"PATH=/usr/bin:/bin"}, python().readonly_paths, small_limits());
  EXPECT_TRUE(r.started) << r.message;
  EXPECT_EQ(r.exit_code, 0) << r.err << " [" << r.isolation << ": " << r.message << "]";
  EXPECT_NE(r.out.find("hi"), std::string::npos);
  EXPECT_TRUE(fs::exists(work.p / "f.txt")) << "the work folder is writable";
  EXPECT_TRUE(group_gone(r.pgid));
  // Where namespaces are refused the run falls back, and says so.
  if (r.isolation != "namespaces") std::printf("[ note ] sandbox isolation here: %s (%s)\n", r.isolation.c_str(), r.message.c_str());
}

TEST(OrSandbox, ForkBombIsContained) {
  NEED_PYTHON();
  const std::string code =
      "import os, time\n"
      "n = 0\n"
      "while True:\n"
      "    try:\n"
      "        os.fork(); n += 1\n"
      "    except OSError:\n"
      "        time.sleep(0.01)\n";
  SandboxLimits l = small_limits();
  l.wall_s = 3;
  CodeVerdict v = run_solver_code(code, python(), l);
  EXPECT_TRUE(v.failure == "timeout" || v.failure == "runtime_error") << v.failure << ": " << v.result.message;
  EXPECT_LT(v.seconds, l.wall_s + 3);
  EXPECT_TRUE(group_gone(v.pgid)) << "processes of the fork bomb are still running";
}

TEST(OrSandbox, InfiniteLoopTimesOut) {
  NEED_PYTHON();
  // (a wall clock far above the CPU limit: on a loaded machine 2 s of CPU may take longer than 6 s)
  SandboxLimits c = small_limits();
  c.wall_s = 30;
  CodeVerdict v = run_solver_code("while True:\n    pass\n", python(), c);
  EXPECT_EQ(v.failure, "timeout") << v.result.message;
  EXPECT_EQ(v.limit, "cpu") << v.result.message;
  EXPECT_NE(v.result.message.find("CPU-time limit"), std::string::npos) << v.result.message;
  EXPECT_LT(v.seconds, c.wall_s + 3);
  EXPECT_TRUE(group_gone(v.pgid));
  // A sleeping program uses no CPU time: the wall-clock limit ends it.
  SandboxLimits l = small_limits();
  l.wall_s = 1.5;
  CodeVerdict w = run_solver_code("import time\ntime.sleep(100)\n", python(), l);
  EXPECT_EQ(w.failure, "timeout");
  EXPECT_EQ(w.limit, "wall") << w.result.message;
  EXPECT_NE(w.result.message.find("wall-clock"), std::string::npos) << w.result.message;
  EXPECT_LT(w.seconds, l.wall_s + 3);
  EXPECT_TRUE(group_gone(w.pgid));
}

// Which limit ended a run is read from who ended it, never guessed from the times. The CPU and
// wall-clock cases run on a quiet machine and with every core busy (the kernel's RLIMIT_CPU clock
// runs ahead of the precise one under load: a 2 s RLIMIT_CPU was measured killing at 1.73 s of
// precise CPU time, which a label read from the times would have called something else).
TEST(OrSandbox, LimitLabelsSayWhichLimit) {
  NEED_PYTHON();
  auto run = [&](const std::string& code, double wall_s) {
    TmpDir work;
    SandboxLimits l = small_limits();
    l.wall_s = wall_s;
    return sandbox_run({python().python, "-c", code}, work.p.string(), {"PATH=/usr/bin:/bin"}, python().readonly_paths, l);
  };
  const double cpu_s = small_limits().cpu_s;
  for (const bool loaded : {false, true}) {
    SCOPED_TRACE(loaded ? "every core busy" : "quiet");
    std::vector<pid_t> load;
    if (loaded) {
      const unsigned n = std::min(8u, std::max(1u, std::thread::hardware_concurrency())) + 1;
      for (unsigned i = 0; i < n; ++i) {
        const pid_t c = ::fork();
        if (c == 0) {
          ::alarm(60);  // never outlives the test by long, whatever happens to it
          for (uint64_t k = 0;; ++k) asm volatile("" : "+r"(k));
        }
        if (c > 0) load.push_back(c);
      }
    }
    // The CPU limit: the monitor kills at the limit of precise CPU time, and the rusage says so.
    const SandboxResult cpu = run("while True:\n    pass\n", 60);
    EXPECT_TRUE(cpu.cpu_limit);
    EXPECT_EQ(cpu.cpu_by, "monitor");
    EXPECT_FALSE(cpu.wall_timeout);
    EXPECT_EQ(cpu.signal, SIGKILL);
    EXPECT_GE(cpu.cpu_monitor_seconds, cpu_s);
    EXPECT_GE(cpu.cpu_seconds, cpu_s) << "rusage of the killed program";
    // The wall clock: a sleeper uses no CPU.
    const SandboxResult wall = run("import time\ntime.sleep(100)\n", 1.5);
    EXPECT_TRUE(wall.wall_timeout);
    EXPECT_FALSE(wall.cpu_limit);
    EXPECT_EQ(wall.cpu_by, "");
    EXPECT_LT(wall.cpu_seconds, 1.0);  // (-1: unknown after a wall-clock kill)
    for (pid_t c : load) ::kill(c, SIGKILL);
    for (pid_t c : load) ::waitpid(c, nullptr, 0);
  }
  // Ignoring SIGXCPU changes nothing: the monitor acts on its own clock.
  const SandboxResult ign = run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n", 60);
  EXPECT_EQ(ign.cpu_by, "monitor");
  EXPECT_GE(ign.cpu_seconds, cpu_s);
  // The kernel's RLIMIT_CPU soft limit (the program lowered its own to 1 s): SIGXCPU names it.
  const SandboxResult xcpu = run(
      "import resource\nh = resource.getrlimit(resource.RLIMIT_CPU)[1]\nresource.setrlimit(resource.RLIMIT_CPU, (1, h))\n"
      "while True:\n    pass\n",
      60);
  EXPECT_TRUE(xcpu.cpu_limit);
  EXPECT_EQ(xcpu.cpu_by, "SIGXCPU");
  EXPECT_EQ(xcpu.signal, SIGXCPU);
  // A SIGKILL that is no limit of the sandbox (the program's own, after more than half its CPU
  // time) is not called a limit: runtime_error, "killed by signal 9".
  const std::string self_kill =
      "import os, time\nt = time.process_time()\nwhile time.process_time() - t < 1.2:\n    pass\nos.kill(os.getpid(), 9)\n";
  const SandboxResult self = run(self_kill, 60);
  EXPECT_FALSE(self.cpu_limit);
  EXPECT_FALSE(self.wall_timeout);
  EXPECT_EQ(self.signal, SIGKILL);
  EXPECT_GE(self.cpu_seconds, 1.0);
  // The judge's labels for the same programs.
  SandboxLimits l = small_limits();
  l.wall_s = 60;
  const CodeVerdict jc = run_solver_code("while True:\n    pass\n", python(), l);
  EXPECT_EQ(jc.failure, "timeout");
  EXPECT_EQ(jc.limit, "cpu");
  EXPECT_NE(jc.result.message.find("CPU-time limit of 2 s"), std::string::npos) << jc.result.message;
  const CodeVerdict jx = run_solver_code(
      "import resource\nh = resource.getrlimit(resource.RLIMIT_CPU)[1]\nresource.setrlimit(resource.RLIMIT_CPU, (1, h))\n"
      "while True:\n    pass\n",
      python(), l);
  EXPECT_EQ(jx.limit, "cpu");
  EXPECT_NE(jx.result.message.find("SIGXCPU"), std::string::npos) << jx.result.message;
  const CodeVerdict js = run_solver_code(self_kill, python(), l);
  EXPECT_EQ(js.failure, "runtime_error") << js.result.message;
  EXPECT_EQ(js.limit, "");
  EXPECT_NE(js.result.message.find("killed by signal 9"), std::string::npos) << js.result.message;
}

TEST(OrSandbox, HugeAllocationFails) {
  NEED_PYTHON();
  CodeVerdict v = run_solver_code("x = bytearray(10 * 1024 ** 3)\nprint(len(x))\n", python(), small_limits());
  EXPECT_EQ(v.failure, "runtime_error");
  EXPECT_NE(v.result.message.find("MemoryError"), std::string::npos) << v.result.message;
  EXPECT_TRUE(group_gone(v.pgid));
}

TEST(OrSandbox, WriteOutsideWorkFolderFails) {
  NEED_PYTHON();
  TmpDir outside;
  const fs::path target = outside.p / "written.txt";
  for (const std::string& path : {target.string(), std::string("/etc/trex-sandbox-probe"), std::string("/usr/trex-probe")}) {
    CodeVerdict v = run_solver_code("open('" + path + "', 'w').write('x')\n", python(), small_limits());
    EXPECT_EQ(v.failure, "runtime_error") << path;
    EXPECT_FALSE(fs::exists(path)) << path << " was written from the sandbox";
    EXPECT_TRUE(group_gone(v.pgid));
  }
}

TEST(OrSandbox, ReadOutsideViewFails) {
  NEED_PYTHON();
  TmpDir outside;
  const fs::path secret = outside.p / "secret.txt";
  std::ofstream(secret) << "TOP-SECRET-7431";
  CodeVerdict v = run_solver_code("print(open('" + secret.string() + "').read())\n", python(), small_limits());
  if (v.isolation != "namespaces") GTEST_SKIP() << "no read-only view here (" << v.isolation << "): the fallback cannot hide files";
  EXPECT_EQ(v.failure, "runtime_error");
  EXPECT_NE(v.result.message.find("No such file"), std::string::npos) << v.result.message;
  EXPECT_EQ(v.result.message.find("TOP-SECRET"), std::string::npos);
  EXPECT_TRUE(group_gone(v.pgid));
}

TEST(OrSandbox, NoNetwork) {
  NEED_PYTHON();
  // A listener on the host's loopback: the program must not reach it.
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(ls, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ASSERT_EQ(::bind(ls, (sockaddr*)&a, sizeof a), 0);
  ASSERT_EQ(::listen(ls, 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(ls, (sockaddr*)&a, &len);
  const int port = ntohs(a.sin_port);
  CodeVerdict v = run_solver_code("import socket\nsocket.create_connection(('127.0.0.1', " + std::to_string(port) +
                                      "), timeout=2).sendall(b'x')\n",
                                  python(), small_limits());
  const int c = ::accept(ls, nullptr, nullptr);
  const int accept_errno = errno;
  ::close(ls);
  if (v.isolation != "namespaces") GTEST_SKIP() << "no network namespace here (" << v.isolation << ")";
  EXPECT_LT(c, 0) << "the sandboxed program connected to the host";
  EXPECT_TRUE(accept_errno == EAGAIN || accept_errno == EWOULDBLOCK);
  EXPECT_EQ(v.failure, "runtime_error") << v.result.message;
  EXPECT_TRUE(group_gone(v.pgid));
}

TEST(OrSandbox, EvaluateGoesOnAfterHostilePrograms) {
  NEED_MODULE("pulp");
  // Problem 0: a fork bomb; problem 1: an endless loop; problem 2: a right PuLP program.
  std::vector<Problem> probs(3);
  for (size_t i = 0; i < probs.size(); ++i) {
    probs[i].id = std::to_string(i);
    probs[i].category = "all";
    probs[i].truth = parse_truth(nlohmann::json(7));
  }
  struct Src : OutputSource {
    std::string output(const Problem& p, size_t i) override {
      if (i == 0) return "```python\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n```";
      if (i == 1) return "```python\nwhile True:\n    pass\n```";
      return "```python\nimport pulp\nm = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0, 7)\nm += x\n"
             "m.solve(pulp.PULP_CBC_CMD(msg=0))\n```";
    }
  } src;
  EvalOptions o;
  o.sandbox = small_limits();
  o.sandbox.wall_s = 3;
  std::ostringstream res;
  EvalSummary s = evaluate(probs, src, o, &res);
  EXPECT_EQ(s.all.n, 3);
  EXPECT_EQ(s.all.strict, 1);
  EXPECT_EQ(s.all.failures["timeout"] + s.all.failures["runtime_error"], 2);
  std::istringstream lines(res.str());
  std::string line;
  std::vector<nlohmann::json> js;
  while (std::getline(lines, line)) js.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(js.size(), 3u);
  EXPECT_EQ(js[1]["failure"], "timeout") << js[1]["message"];
  EXPECT_TRUE(js[2]["failure"].is_null());
  EXPECT_EQ(js[2]["objective_source"], "pulp");
}
