#include "or/code_judge.h"
#include <unistd.h>
#include <cctype>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <nlohmann/json.hpp>
#include "core/error.h"

namespace trex::orx {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}
std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Runs program.py (argv[1]) with hooks that record every solved model, then writes what it found
// as one JSON object to the file named by argv[2] (which the program never sees).
const char* kHarness = R"PY(import sys, os, io, json, re, traceback
_out = sys.argv[2]
sys.argv = ["program.py"]
R = {"error": None, "message": None, "missing": None, "status": None, "objective": None, "source": None}
SOLVER_MODULES = {"pulp", "pyomo", "gurobipy", "coptpy", "docplex", "cplex", "mosek", "xpress", "pyscipopt",
                  "highspy", "ortools", "mip", "cvxpy", "scipy", "numpy"}
solved = []

class Tee(io.TextIOBase):
    def __init__(self, real):
        self.real, self.buf = real, []
    def write(self, s):
        if sum(len(x) for x in self.buf) < 1 << 20:
            self.buf.append(s)
        return self.real.write(s)
    def flush(self):
        self.real.flush()

def hook_pulp():
    import pulp
    orig = pulp.LpProblem.solve
    def solve(self, *a, **k):
        r = orig(self, *a, **k)
        solved.append(("pulp", self, None))
        return r
    pulp.LpProblem.solve = solve

def hook_pyomo():
    from pyomo.opt.base.solvers import OptSolver
    orig = OptSolver.solve
    def solve(self, *a, **k):
        r = orig(self, *a, **k)
        if a:
            solved.append(("pyomo", a[0], r))
        return r
    OptSolver.solve = solve

def hook_gurobipy():
    import gurobipy
    orig = gurobipy.Model.optimize
    def optimize(self, *a, **k):
        r = orig(self, *a, **k)
        solved.append(("gurobipy", self, None))
        return r
    gurobipy.Model.optimize = optimize

def hook_coptpy():
    import coptpy
    for name in ("solve", "solveLP"):
        orig = getattr(coptpy.Model, name, None)
        if orig is None:
            continue
        def solve(self, *a, _orig=orig, **k):
            r = _orig(self, *a, **k)
            solved.append(("coptpy", self, None))
            return r
        setattr(coptpy.Model, name, solve)

def emit():
    with open(_out, "w") as f:
        json.dump(R, f)

def missing_solver(e):
    t = str(e)
    return any(k in t for k in ("No executable found", "Not Available", "unavailable solver", "cannot execute", "not available",
                                "No such file or directory: 'gurobi", "license"))

src = open("program.py", encoding="utf-8", errors="replace").read()
try:
    code = compile(src, "program.py", "exec")
except SyntaxError as e:
    R["error"], R["message"] = "syntax", "%s (line %s)" % (e.msg, e.lineno)
    emit()
    sys.exit(0)
for name, hook in (("pulp", hook_pulp), ("pyomo", hook_pyomo), ("gurobipy", hook_gurobipy), ("coptpy", hook_coptpy)):
    if name in src:
        try:
            hook()
        except Exception:
            pass
# Solver modules the program tried to import and could not, also where it caught the error: a
# program that solved no model after one of these is "solver unavailable", whatever it printed.
import builtins
_import = builtins.__import__
missing_modules = []
def checked_import(name, *a, **k):
    try:
        return _import(name, *a, **k)
    except ModuleNotFoundError as e:
        root = (e.name or name or "").split(".")[0]
        if root in SOLVER_MODULES and root not in missing_modules:
            missing_modules.append(root)
        raise
builtins.__import__ = checked_import
tee = Tee(sys.stdout)
sys.stdout = tee
g = {"__name__": "__main__", "__file__": "program.py"}
try:
    exec(code, g)
except SystemExit:
    pass
except ModuleNotFoundError as e:
    root = (e.name or "").split(".")[0]
    if root in SOLVER_MODULES:
        R["missing"] = "Python module %s is not installed" % root
    else:
        R["error"], R["message"] = "runtime", "ModuleNotFoundError: %s" % e
except BaseException as e:
    if missing_solver(e):
        R["missing"] = "%s: %s" % (type(e).__name__, str(e)[:300])
    else:
        R["error"] = "runtime"
        R["message"] = "".join(traceback.format_exception_only(type(e), e)).strip()[-1500:]
sys.stdout = tee.real
builtins.__import__ = _import

def from_pulp(p):
    import pulp
    st = pulp.LpStatus.get(p.status, str(p.status))
    if st == "Optimal":
        v = p.objective.value() if p.objective is not None else 0.0
        return "optimal", (0.0 if v is None else float(v))
    if st == "Infeasible":
        return "infeasible", None
    if st == "Unbounded":
        return "unbounded", None
    return "error: pulp status " + st, None

def from_pyomo(m, res):
    from pyomo.environ import Objective, value
    tc = str(res.solver.termination_condition)
    if tc in ("optimal", "locallyOptimal", "globallyOptimal"):
        objs = list(m.component_data_objects(Objective, active=True))
        return "optimal", (float(value(objs[0])) if objs else 0.0)
    if tc == "infeasible":
        return "infeasible", None
    if tc == "unbounded":
        return "unbounded", None
    if tc == "maxTimeLimit":
        return "timeout", None
    return "error: pyomo termination " + tc, None

def from_gurobipy(v):
    gp = sys.modules["gurobipy"]
    s = v.Status
    if s == gp.GRB.OPTIMAL:
        return "optimal", float(v.ObjVal)
    if s == gp.GRB.INFEASIBLE:
        return "infeasible", None
    if s == gp.GRB.UNBOUNDED:
        return "unbounded", None
    if s == gp.GRB.TIME_LIMIT:
        return "timeout", None
    return "error: gurobi status %d" % s, None

def from_coptpy(v):
    cp = sys.modules["coptpy"]
    s = v.status
    if s == cp.COPT.OPTIMAL:
        return "optimal", float(v.objval)
    if s == cp.COPT.INFEASIBLE:
        return "infeasible", None
    if s == cp.COPT.UNBOUNDED:
        return "unbounded", None
    if s == cp.COPT.TIMEOUT:
        return "timeout", None
    return "error: copt status %d" % s, None

READERS = {"pulp": lambda m, res: from_pulp(m), "pyomo": from_pyomo,
           "gurobipy": lambda m, res: from_gurobipy(m), "coptpy": lambda m, res: from_coptpy(m)}

def from_globals():
    # A model solved some way the hooks did not see (e.g. a hook that could not be installed).
    gp = sys.modules.get("gurobipy")
    cp = sys.modules.get("coptpy")
    for v in list(g.values())[::-1]:
        if gp is not None and isinstance(v, gp.Model):
            return ("gurobipy",) + from_gurobipy(v)
        if cp is not None and isinstance(v, cp.Model):
            return ("coptpy",) + from_coptpy(v)
    return None

def from_printed(text):
    num = r"(-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?)"
    for line in reversed(text.splitlines()):
        low = line.lower()
        if "no best solution" in low or "infeasible" in low:
            return "infeasible", None
        if "unbounded" in low:
            return "unbounded", None
        if re.search(r"objective|optimal|best|total", low):
            m = re.findall(num, line)
            if m:
                return "optimal", float(m[-1].replace(",", ""))
    return None

if R["error"] is None and R["missing"] is None and not solved and missing_modules:
    R["missing"] = "Python module %s is not installed (the program solved no model)" % ", ".join(missing_modules)
if R["error"] is None and R["missing"] is None:
    try:
        got = None
        if solved:
            kind, m, res = solved[-1]
            st, obj = READERS[kind](m, res)
            got = (kind, st, obj)
        else:
            got = from_globals()
        if got is None:
            p = from_printed("".join(tee.buf))
            if p is not None:
                got = ("printed",) + p
        if got is not None:
            R["source"], R["status"], R["objective"] = got
    except BaseException as e:
        R["error"], R["message"] = "runtime", "reading the result: %s: %s" % (type(e).__name__, e)
emit()
)PY";

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : "..." + s.substr(s.size() - n); }

}  // namespace

ExtractedCode extract_code(const std::string& output) {
  ExtractedCode r;
  r.how = "none";
  std::vector<std::pair<std::string, std::string>> fences;  // (lang, body)
  std::istringstream in(output);
  std::string line;
  bool open = false;
  std::string lang, body;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string t = trim(line);
    if (t.rfind("```", 0) == 0) {
      if (open) {
        fences.emplace_back(lang, body);
        open = false;
      } else {
        open = true;
        lang = lower(trim(t.substr(3)));
        body.clear();
      }
      continue;
    }
    if (open) body += line + "\n";
  }
  if (open) fences.emplace_back(lang, body);  // an unclosed final fence
  for (auto it = fences.rbegin(); it != fences.rend(); ++it)
    if (it->first == "python" || it->first == "py" || it->first == "python3") {
      r.found = true, r.code = it->second, r.how = "fenced_python";
      return r;
    }
  static const char* libs[] = {"pulp", "pyomo", "gurobipy", "coptpy", "docplex", "pyscipopt", "mip", "ortools"};
  for (auto it = fences.rbegin(); it != fences.rend(); ++it) {
    std::istringstream b(it->second);
    std::string l;
    while (std::getline(b, l)) {
      const std::string t = trim(l);
      bool hit = false;
      for (const char* lib : libs)
        if (t.rfind(std::string("import ") + lib, 0) == 0 || t.rfind(std::string("from ") + lib, 0) == 0) hit = true;
      if (hit) {
        r.found = true, r.code = it->second, r.how = "fenced";
        return r;
      }
    }
  }
  return r;
}

PythonEnv find_python(const std::string& requested) {
  PythonEnv e;
  std::string py = requested;
  if (py.empty()) {
    if (const char* v = std::getenv("TREX_OR_PYTHON")) py = v;
  }
  if (py.empty() && std::filesystem::exists(".venv/bin/python")) py = ".venv/bin/python";
  if (py.empty()) py = "python3";
  // Resolve through PATH for a bare name.
  if (py.find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    std::istringstream ps(path ? path : "");
    std::string dir, found;
    while (std::getline(ps, dir, ':'))
      if (!dir.empty() && ::access((dir + "/" + py).c_str(), X_OK) == 0) {
        found = dir + "/" + py;
        break;
      }
    py = found;
  }
  if (py.empty() || ::access(py.c_str(), X_OK) != 0) {
    e.why = "no Python interpreter found: give --python PATH (or set TREX_OR_PYTHON), e.g. a venv made by "
            "scripts/setup_orpy.sh";
    return e;
  }
  e.python = std::filesystem::absolute(py).lexically_normal().string();
  // The interpreter's prefixes: what it needs to see inside the sandbox.
  // Its first line is the interpreter itself (sys.executable): a launcher found on PATH (a pyenv
  // or asdf shim, a script outside the sandbox's view) is replaced by the binary it starts.
  const std::string cmd = "'" + e.python + "' -c 'import sys, os; print(sys.executable); print(sys.prefix); "
                          "print(sys.base_prefix); print(os.path.dirname(os.path.realpath(sys.executable)))' 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    e.why = "cannot run " + e.python;
    return e;
  }
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    std::string s = trim(buf);
    if (!s.empty()) e.readonly_paths.push_back(s);
  }
  const int rc = ::pclose(p);
  if (rc != 0 || e.readonly_paths.size() < 3) {
    e.why = e.python + " did not run (exit " + std::to_string(rc) + "): give a working --python";
    return e;
  }
  if (!e.readonly_paths.front().empty() && e.readonly_paths.front()[0] == '/' &&
      ::access(e.readonly_paths.front().c_str(), X_OK) == 0)
    e.python = e.readonly_paths.front();
  e.readonly_paths.erase(e.readonly_paths.begin());
  // A venv's interpreter is a link out of it: its real folder and the prefix above it.
  e.readonly_paths.push_back(std::filesystem::path(e.readonly_paths.back()).parent_path().string());
  e.ok = true;
  return e;
}

CodeVerdict run_solver_code(const std::string& code, const PythonEnv& py, const SandboxLimits& limits) {
  CodeVerdict v;
  v.result.status = SolveResult::Error;
  if (!py.ok) {
    v.failure = "solver_unavailable";
    v.result.message = py.why;
    return v;
  }
  char tmpl[] = "/tmp/trex-or-code-XXXXXX";
  TREX_CHECK(::mkdtemp(tmpl) != nullptr, "run_solver_code: mkdtemp failed");
  const std::string dir = tmpl;
  std::mt19937_64 rng(std::random_device{}());
  const std::string result_name = ".result-" + std::to_string(rng()) + ".json";
  {
    std::ofstream(dir + "/program.py", std::ios::binary) << code;
    std::ofstream(dir + "/harness.py", std::ios::binary) << kHarness;
  }
  // Inside the view the work folder is /tmp; without the view (fallback) it is `dir` itself, and
  // the harness is started with relative names so both work.
  const std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "TMPDIR=/tmp",
                                        "PYTHONDONTWRITEBYTECODE=1", "PYTHONIOENCODING=utf-8", "OMP_NUM_THREADS=1",
                                        "LANG=C.UTF-8"};
  const SandboxResult sb = sandbox_run({py.python, "-I", "harness.py", "program.py", result_name}, dir, env,
                                       py.readonly_paths, limits);
  v.isolation = sb.isolation;
  v.seconds = sb.seconds;
  v.pgid = sb.pgid;
  const std::string rpath = dir + "/" + result_name;
  const bool have = std::filesystem::exists(rpath);
  const std::string rtext = have ? read_all(rpath) : std::string();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);

  if (sb.wall_timeout || sb.cpu_limit) {
    v.failure = "timeout";
    v.limit = sb.wall_timeout ? "wall" : "cpu";
    char msg[320];
    if (sb.wall_timeout && sb.cpu_seconds < 0)
      std::snprintf(msg, sizeof msg, "wall-clock limit of %g s reached; the process group was killed", limits.wall_s);
    else if (sb.wall_timeout)
      std::snprintf(msg, sizeof msg, "wall-clock limit of %g s reached (%.2f s of CPU); the process group was killed",
                    limits.wall_s, sb.cpu_seconds);
    else if (sb.cpu_by == "monitor")
      std::snprintf(msg, sizeof msg, "CPU-time limit of %g s reached (%.2f s of CPU read, %.1f s wall); killed", limits.cpu_s,
                    sb.cpu_monitor_seconds, sb.seconds);
    else
      std::snprintf(msg, sizeof msg,
                    "CPU-time limit reached: the kernel's RLIMIT_CPU soft limit (%lld s) sent SIGXCPU (%.2f s of CPU, "
                    "%.1f s wall)",
                    (long long)cpu_rlimit_soft(limits.cpu_s), sb.cpu_seconds, sb.seconds);
    v.result.message = msg;
    return v;
  }
  if (!sb.started) {
    v.failure = "sandbox_error";
    v.result.message = "the sandbox could not start the program: " + sb.message;
    return v;
  }
  nlohmann::json r;
  if (have) {
    try {
      r = nlohmann::json::parse(rtext);
    } catch (const std::exception&) {
      r = nullptr;
    }
  }
  if (!r.is_object()) {
    v.failure = "runtime_error";
    char cpu[64];
    if (sb.cpu_seconds >= 0) std::snprintf(cpu, sizeof cpu, " after %.1f s CPU, %.1f s wall", sb.cpu_seconds, sb.seconds);
    else std::snprintf(cpu, sizeof cpu, " after %.1f s wall", sb.seconds);
    // A signal that is none of the sandbox's limits: the program's own, the kernel's OOM killer, or
    // RLIMIT_CPU's hard limit after the program ignored SIGXCPU.
    v.result.message = sb.signal ? "killed by signal " + std::to_string(sb.signal) + " (" + ::strsignal(sb.signal) +
                                       "; not a limit of the sandbox)" + cpu
                                 : "exit " + std::to_string(sb.exit_code) + ": " + tail(trim(sb.err), 600);
    if (sb.signal == 0 && sb.err.find("MemoryError") != std::string::npos) v.result.message += " (memory limit)";
    return v;
  }
  auto str = [&](const char* k) { return r.contains(k) && r[k].is_string() ? r[k].get<std::string>() : std::string(); };
  if (!str("missing").empty()) {
    v.failure = "solver_unavailable";
    v.result.message = str("missing");
    return v;
  }
  if (str("error") == "syntax") {
    v.failure = "parse_error";
    v.result.status = SolveResult::ParseError;
    v.result.message = "Python syntax error: " + str("message");
    return v;
  }
  if (str("error") == "runtime") {
    v.failure = "runtime_error";
    v.result.message = str("message");
    return v;
  }
  const std::string st = str("status");
  v.objective_source = str("source");
  if (st == "optimal" && r["objective"].is_number()) {
    v.result.status = SolveResult::Optimal;
    v.result.objective = r["objective"].get<double>();
  } else if (st == "infeasible") {
    v.result.status = SolveResult::Infeasible;
  } else if (st == "unbounded") {
    v.result.status = SolveResult::Unbounded;
  } else if (st == "timeout") {
    v.failure = "timeout";
    v.result.status = SolveResult::TimeLimit;
    v.result.message = "the solver hit its time limit";
    v.limit = "solver";
  } else if (st.empty()) {
    v.failure = "no_answer";
    v.result.message = "the program solved no model and printed no objective";
  } else {
    v.failure = "runtime_error";
    v.result.message = st;
  }
  return v;
}

}  // namespace trex::orx
