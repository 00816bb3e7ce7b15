// CBC/CLP implementation of or/solver.h.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <coin/CbcHeuristic.hpp>
#include <coin/CbcModel.hpp>
#include <coin/CglClique.hpp>
#include <coin/CglFlowCover.hpp>
#include <coin/CglGomory.hpp>
#include <coin/CglKnapsackCover.hpp>
#include <coin/CglMixedIntegerRounding2.hpp>
#include <coin/CglProbing.hpp>
#include <coin/ClpSimplex.hpp>
#include <coin/CoinError.hpp>
#include <coin/CoinMessageHandler.hpp>
#include <coin/CoinMpsIO.hpp>
#include <coin/CoinPackedMatrix.hpp>
#include <coin/OsiClpSolverInterface.hpp>
#include "core/timer.h"
#include "or/lp_parser.h"
#include "or/solver.h"

namespace trex::orx {

const char* status_name(SolveResult::Status s) {
  switch (s) {
    case SolveResult::Optimal: return "optimal";
    case SolveResult::Infeasible: return "infeasible";
    case SolveResult::Unbounded: return "unbounded";
    case SolveResult::TimeLimit: return "time_limit";
    case SolveResult::ParseError: return "parse_error";
    case SolveResult::Error: return "error";
  }
  return "error";
}

namespace {

// Collects COIN messages instead of printing them.
class CaptureHandler : public CoinMessageHandler {
 public:
  std::string text;
  int print() override {
    text += messageBuffer();
    text += '\n';
    return 0;
  }
};

void quiet(OsiClpSolverInterface& si) {
  si.messageHandler()->setLogLevel(0);
  si.getModelPtr()->messageHandler()->setLogLevel(0);
  si.setHintParam(OsiDoReducePrint, true, OsiHintTry);
}

double to_coin(double v) {
  if (lp_is_inf(v)) return v < 0 ? -COIN_DBL_MAX : COIN_DBL_MAX;
  return v;
}

// Loads `m` into a fresh CLP interface (objective constant not included).
void load(const LpModel& m, OsiClpSolverInterface& si) {
  const int n = (int)m.vars.size();
  CoinPackedMatrix mat(false, 0, 0);  // row-ordered
  mat.setDimensions(0, n);
  std::vector<double> rlo, rhi;
  for (const auto& r : m.rows) {
    std::vector<int> idx;
    std::vector<double> val;
    for (const auto& t : r.terms) {
      idx.push_back(t.var);
      val.push_back(t.coef);
    }
    mat.appendRow((int)idx.size(), idx.data(), val.data());
    rlo.push_back(to_coin(r.lower()));
    rhi.push_back(to_coin(r.upper()));
  }
  std::vector<double> clo(n), chi(n), obj(n, 0.0);
  for (int j = 0; j < n; ++j) {
    clo[j] = to_coin(m.vars[j].lb);
    chi[j] = to_coin(m.vars[j].ub);
  }
  for (const auto& t : m.obj) obj[t.var] += t.coef;
  si.loadProblem(mat, clo.data(), chi.data(), obj.data(), rlo.data(), rhi.data());
  for (int j = 0; j < n; ++j) {
    si.setColName(j, m.vars[j].name);
    if (m.vars[j].integer) si.setInteger(j);
  }
  si.setObjSense(m.maximize ? -1.0 : 1.0);
}

std::string check_numbers(const LpModel& m) {
  auto bad = [](double v) { return !std::isfinite(v) || lp_is_inf(v); };
  for (const auto& t : m.obj)
    if (bad(t.coef)) return "objective coefficient out of range";
  for (const auto& r : m.rows)
    for (const auto& t : r.terms)
      if (bad(t.coef)) return "coefficient out of range in row '" + r.name + "'";
  for (const auto& v : m.vars)
    if (std::isnan(v.lb) || std::isnan(v.ub)) return "bad bound on '" + v.name + "'";
  for (const auto& r : m.rows)
    if (std::isnan(r.rhs) || std::isnan(r.range_lo)) return "bad right-hand side in row '" + r.name + "'";
  if (!std::isfinite(m.obj_const) || lp_is_inf(m.obj_const)) return "objective constant out of range";
  if (m.vars.empty()) return "the model has no variables";
  return "";
}

// A row or variable bounded by an infinity on the wrong side (a x >= +inf, x <= -inf) has no
// feasible point. CLP asserts (aborts the process) on such bounds, so they are settled here.
std::string infinite_bound(const LpModel& m) {
  for (const auto& r : m.rows) {
    if (lp_is_inf(r.lower()) && r.lower() > 0) return "row '" + r.name + "' must be >= +infinity";
    if (lp_is_inf(r.upper()) && r.upper() < 0) return "row '" + r.name + "' must be <= -infinity";
  }
  for (const auto& v : m.vars) {
    if (lp_is_inf(v.lb) && v.lb > 0) return "variable '" + v.name + "' has lower bound +infinity";
    if (lp_is_inf(v.ub) && v.ub < 0) return "variable '" + v.name + "' has upper bound -infinity";
  }
  return "";
}

void add_cuts(CbcModel& cbc) {
  CglProbing probing;
  probing.setUsingObjective(true);
  probing.setMaxPass(1);
  probing.setMaxProbe(10);
  probing.setMaxLook(10);
  CglGomory gomory;
  gomory.setLimit(100);
  CglKnapsackCover knap;
  CglClique clique;
  clique.setStarCliqueReport(false);
  clique.setRowCliqueReport(false);
  CglMixedIntegerRounding2 mir;
  CglFlowCover flow;
  cbc.addCutGenerator(&probing, -1, "Probing");
  cbc.addCutGenerator(&gomory, -1, "Gomory");
  cbc.addCutGenerator(&knap, -1, "Knapsack");
  cbc.addCutGenerator(&clique, -1, "Clique");
  cbc.addCutGenerator(&mir, -1, "MIR2");
  cbc.addCutGenerator(&flow, -1, "FlowCover");
  CbcRounding rounding(cbc);
  cbc.addHeuristic(&rounding);
}

// Branch and cut on `si` (already loaded). Returns the CBC verdict.
SolveResult run_cbc(const OsiClpSolverInterface& si, double seconds, const LpModel& m) {
  SolveResult r;
  CbcModel cbc(si);
  cbc.setLogLevel(0);
  cbc.messageHandler()->setLogLevel(0);
  cbc.solver()->messageHandler()->setLogLevel(0);
  cbc.setMaximumSeconds(std::max(0.01, seconds));
  add_cuts(cbc);
  cbc.branchAndBound();
  if (cbc.isProvenOptimal() && cbc.bestSolution()) {
    r.status = SolveResult::Optimal;
    r.objective = cbc.getObjValue() + m.obj_const;
    const double* x = cbc.bestSolution();
    for (size_t j = 0; j < m.vars.size(); ++j) r.values.emplace_back(m.vars[j].name, x[j]);
  } else if (cbc.isProvenInfeasible()) {
    r.status = SolveResult::Infeasible;
  } else if (cbc.isContinuousUnbounded()) {
    r.status = SolveResult::Unbounded;
  } else if (cbc.isSecondsLimitReached()) {
    r.status = SolveResult::TimeLimit;
    r.message = cbc.bestSolution() ? "time limit with an incumbent of objective " + std::to_string(cbc.getObjValue() + m.obj_const)
                                    : "time limit before any integer solution";
  } else {
    r.status = SolveResult::Error;
    r.message = "CBC stopped with status " + std::to_string(cbc.status()) + "/" + std::to_string(cbc.secondaryStatus());
  }
  return r;
}

// The relaxation is dual infeasible: the problem is unbounded if it has any feasible point.
SolveResult unbounded_or_infeasible(const LpModel& m, double seconds) {
  LpModel z = m;
  z.obj.clear();
  OsiClpSolverInterface si;
  quiet(si);
  load(z, si);
  si.getModelPtr()->setMaximumSeconds(seconds);
  si.initialSolve();
  SolveResult r;
  if (si.isProvenPrimalInfeasible()) {
    r.status = SolveResult::Infeasible;
    return r;
  }
  if (!si.isProvenOptimal()) {
    r.status = SolveResult::TimeLimit;
    r.message = "could not settle feasibility of the unbounded relaxation";
    return r;
  }
  if (!m.has_integers()) {
    r.status = SolveResult::Unbounded;
    return r;
  }
  SolveResult f = run_cbc(si, seconds, z);
  if (f.status == SolveResult::Optimal) r.status = SolveResult::Unbounded;
  else if (f.status == SolveResult::Infeasible) r.status = SolveResult::Infeasible;
  else {
    r.status = SolveResult::TimeLimit;
    r.message = "relaxation unbounded; integer feasibility not settled in time";
  }
  return r;
}

SolveResult solve_impl(const LpModel& m, double seconds) {
  SolveResult r;
  if (std::string bad = check_numbers(m); !bad.empty()) {
    r.status = SolveResult::Error;
    r.message = bad;
    return r;
  }
  if (std::string inf = infinite_bound(m); !inf.empty()) {
    r.status = SolveResult::Infeasible;
    r.message = inf;
    return r;
  }
  const double t0 = now_ms();
  OsiClpSolverInterface si;
  quiet(si);
  load(m, si);
  si.getModelPtr()->setMaximumSeconds(seconds);
  si.initialSolve();
  const double left = seconds - (now_ms() - t0) / 1000.0;
  if (si.isProvenOptimal()) {
    if (!m.has_integers()) {
      r.status = SolveResult::Optimal;
      r.objective = si.getObjValue() + m.obj_const;
      const double* x = si.getColSolution();
      for (size_t j = 0; j < m.vars.size(); ++j) r.values.emplace_back(m.vars[j].name, x[j]);
      return r;
    }
    return run_cbc(si, left, m);
  }
  if (si.isProvenPrimalInfeasible()) {
    r.status = SolveResult::Infeasible;
    return r;
  }
  if (si.isProvenDualInfeasible()) return unbounded_or_infeasible(m, std::max(0.5, left));
  const int st = si.getModelPtr()->status();
  if (st == 3 || si.isIterationLimitReached()) {
    r.status = SolveResult::TimeLimit;
    r.message = "LP relaxation hit the time or iteration limit";
  } else {
    r.status = SolveResult::Error;
    r.message = "CLP stopped with status " + std::to_string(st);
  }
  return r;
}

template <class F>
SolveResult guarded(F&& f) {
  const double t0 = now_ms();
  SolveResult r;
  try {
    r = f();
  } catch (const CoinError& e) {
    r = SolveResult{};
    r.status = SolveResult::Error;
    r.message = "COIN error in " + e.className() + "::" + e.methodName() + ": " + e.message();
  } catch (const std::exception& e) {
    r = SolveResult{};
    r.status = SolveResult::Error;
    r.message = e.what();
  } catch (...) {
    r = SolveResult{};
    r.status = SolveResult::Error;
    r.message = "unknown exception from the solver library";
  }
  r.seconds = (now_ms() - t0) / 1000.0;
  return r;
}

// CoinMpsIO ignores OBJSENSE (and printf's that it does): take the section out here, keeping
// line numbers (the lines become '*' comments), and return the sense it gave.
std::string strip_objsense(const std::string& text, bool& maximize) {
  std::vector<std::string> lines;
  size_t b = 0;
  while (b <= text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    lines.push_back(text.substr(b, e - b));
    b = e + 1;
  }
  auto upper_words = [](const std::string& l) {
    std::vector<std::string> w;
    std::string cur;
    for (char c : l + " ") {
      if (std::isspace((unsigned char)c)) {
        if (!cur.empty()) w.push_back(cur);
        cur.clear();
      } else {
        cur += (char)std::toupper((unsigned char)c);
      }
    }
    return w;
  };
  auto sense_word = [](const std::string& w) { return w.rfind("MAX", 0) == 0 ? 1 : w.rfind("MIN", 0) == 0 ? 0 : -1; };
  for (size_t i = 0; i < lines.size(); ++i) {
    auto w = upper_words(lines[i]);
    if (w.empty() || w[0] != "OBJSENSE") continue;
    lines[i] = "*";
    if (w.size() > 1 && sense_word(w[1]) >= 0) {
      maximize = sense_word(w[1]) == 1;
    } else {
      for (size_t k = i + 1; k < lines.size(); ++k) {
        auto w2 = upper_words(lines[k]);
        if (w2.empty()) continue;
        if (sense_word(w2[0]) >= 0 && std::isspace((unsigned char)lines[k][0])) {
          maximize = sense_word(w2[0]) == 1;
          lines[k] = "*";
        }
        break;
      }
    }
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) out += lines[i] + (i + 1 < lines.size() ? "\n" : "");
  return out;
}

// CoinMpsIO (CoinUtils 2.11) reads a line into a buffer of MAX_CARD_LENGTH bytes and copies
// each field into buffers of COIN_MAX_FIELD_LENGTH bytes without a length check: a longer field
// corrupts memory (found by fuzz/fuzz_mps.cpp). Such text is refused here, with its line (the
// reader also runs in a child process, see read_mps). Returns "" if the text is within limits.
std::string mps_limits(const std::string& text, int& line) {
  line = 1;
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    if (e - b >= MAX_CARD_LENGTH - 2)
      return "line longer than " + std::to_string(MAX_CARD_LENGTH - 3) + " characters";
    for (size_t i = b; i < e;) {
      if (text[i] == '\0') return "NUL byte in MPS text";
      if (std::isspace((unsigned char)text[i])) {
        ++i;
        continue;
      }
      size_t f = i;
      while (i < e && !std::isspace((unsigned char)text[i]) && text[i] != '\0') ++i;
      if (i - f >= COIN_MAX_FIELD_LENGTH - 1)
        return "field of " + std::to_string(i - f) + " characters (the MPS reader takes at most " +
               std::to_string(COIN_MAX_FIELD_LENGTH - 2) + ")";
    }
    b = e + 1;
    ++line;
  }
  return "";
}

// The MPS file at `path` -> LpModel through CoinMpsIO (messages captured; m.maximize is set by
// the caller). Runs in the child process of read_mps.
SolveResult read_mps_coin(const std::string& path, LpModel& m) {
  SolveResult r;
  CaptureHandler h;
  h.setLogLevel(1);
  CoinMpsIO io;
  io.passInMessageHandler(&h);
  io.setInfinity(COIN_DBL_MAX);
  const int errors = io.readMps(path.c_str(), "");
  if (errors != 0) {
    r.status = SolveResult::ParseError;
    // Keep the warnings and errors (CoinNNNNW / CoinNNNNE); the first one with a line gives r.line.
    const std::regex we("Coin[0-9]+[WE] .*"), ln("line ([0-9]+)");
    for (auto it = std::sregex_iterator(h.text.begin(), h.text.end(), we); it != std::sregex_iterator(); ++it) {
      const std::string msg = it->str();
      r.message += msg + "\n";
      std::smatch mt;
      if (!r.line && std::regex_search(msg, mt, ln)) r.line = std::atoi(mt[1].str().c_str());
    }
    if (r.message.empty()) r.message = h.text.empty() ? "MPS read failed" : h.text;
    return r;
  }
  const int n = io.getNumCols(), nr = io.getNumRows();
  const double *clo = io.getColLower(), *chi = io.getColUpper(), *obj = io.getObjCoefficients();
  const double *rlo = io.getRowLower(), *rhi = io.getRowUpper();
  for (int j = 0; j < n; ++j) {
    int k = m.add_var(io.columnName(j), clo[j] <= -1e20 ? -kLpInf : clo[j], chi[j] >= 1e20 ? kLpInf : chi[j], io.isInteger(j));
    if (obj[j] != 0) m.obj.push_back({k, obj[j]});
  }
  m.obj_const = -io.objectiveOffset();
  const CoinPackedMatrix* byrow = io.getMatrixByRow();
  for (int i = 0; i < nr; ++i) {
    LpRow row;
    row.name = io.rowName(i);
    const CoinShallowPackedVector v = byrow->getVector(i);
    for (int k = 0; k < v.getNumElements(); ++k) row.terms.push_back({v.getIndices()[k], v.getElements()[k]});
    const bool lo_inf = rlo[i] <= -1e20, hi_inf = rhi[i] >= 1e20;
    if (!lo_inf && !hi_inf && rlo[i] == rhi[i]) { row.sense = RowSense::EQ; row.rhs = rhi[i]; }
    else if (lo_inf) { row.sense = RowSense::LE; row.rhs = hi_inf ? kLpInf : rhi[i]; }
    else if (hi_inf) { row.sense = RowSense::GE; row.rhs = rlo[i]; }
    else { row.sense = RowSense::Range; row.range_lo = rlo[i]; row.rhs = rhi[i]; }
    m.rows.push_back(std::move(row));
  }
  r.status = SolveResult::Optimal;  // "read fine"
  return r;
}

// A SolveResult and LpModel as bytes, from the MPS reader child to its parent.
struct WireOut {
  std::string b;
  void u64(uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }
  void f64(double v) { b.append(reinterpret_cast<const char*>(&v), 8); }
  void str(const std::string& s) {
    u64(s.size());
    b += s;
  }
};
struct WireIn {
  const std::string& b;
  size_t p = 0;
  bool ok = true;
  uint64_t u64() {
    uint64_t v = 0;
    if (b.size() - p < 8) ok = false;
    else std::memcpy(&v, b.data() + p, 8), p += 8;
    return v;
  }
  double f64() {
    uint64_t u = u64();
    double v;
    std::memcpy(&v, &u, 8);
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    if (!ok || n > b.size() - p) {
      ok = false;
      return {};
    }
    p += n;
    return b.substr(p - n, n);
  }
};

void put_read(WireOut& w, const SolveResult& r, const LpModel& m) {
  w.u64(r.status);
  w.str(r.message);
  w.u64(static_cast<uint64_t>(r.line));
  w.f64(m.obj_const);
  w.u64(m.vars.size());
  for (const LpVar& v : m.vars) {
    w.str(v.name);
    w.f64(v.lb);
    w.f64(v.ub);
    w.u64(v.integer);
  }
  w.u64(m.obj.size());
  for (const LpTerm& t : m.obj) w.u64(t.var), w.f64(t.coef);
  w.u64(m.rows.size());
  for (const LpRow& row : m.rows) {
    w.str(row.name);
    w.u64(static_cast<uint64_t>(row.sense));
    w.f64(row.rhs);
    w.f64(row.range_lo);
    w.u64(row.terms.size());
    for (const LpTerm& t : row.terms) w.u64(t.var), w.f64(t.coef);
  }
}

bool get_read(WireIn& in, SolveResult& r, LpModel& m) {
  r.status = static_cast<SolveResult::Status>(in.u64() % 6);
  r.message = in.str();
  r.line = static_cast<int>(in.u64());
  m.obj_const = in.f64();
  for (uint64_t n = in.u64(); in.ok && n > 0; --n) {
    LpVar v;
    v.name = in.str();
    v.lb = in.f64();
    v.ub = in.f64();
    v.integer = in.u64() != 0;
    m.index.emplace(v.name, static_cast<int>(m.vars.size()));
    m.vars.push_back(std::move(v));
  }
  auto term = [&](std::vector<LpTerm>& ts) {
    const uint64_t j = in.u64();
    const double c = in.f64();
    if (j >= m.vars.size()) in.ok = false;
    else ts.push_back({static_cast<int>(j), c});
  };
  for (uint64_t n = in.u64(); in.ok && n > 0; --n) term(m.obj);
  for (uint64_t n = in.u64(); in.ok && n > 0; --n) {
    LpRow row;
    row.name = in.str();
    row.sense = static_cast<RowSense>(in.u64() % 4);
    row.rhs = in.f64();
    row.range_lo = in.f64();
    for (uint64_t k = in.u64(); in.ok && k > 0; --k) term(row.terms);
    m.rows.push_back(std::move(row));
  }
  return in.ok && in.p == in.b.size();
}

// MPS text -> LpModel. CoinMpsIO is not robust against malformed text (fuzz/fuzz_mps.cpp found a
// heap overflow and NULL dereferences inside it), so it runs in a forked child that sends the
// model back through a pipe: a crash there becomes a ParseError instead of ending trex.
SolveResult read_mps(const std::string& text_in, LpModel& m) {
  SolveResult r;
  {
    int line = 0;
    if (std::string bad = mps_limits(text_in, line); !bad.empty()) {
      r.status = SolveResult::ParseError;
      r.message = "line " + std::to_string(line) + ": " + bad;
      r.line = line;
      return r;
    }
  }
  bool maximize = false;
  const std::string text = strip_objsense(text_in, maximize);
  m.maximize = maximize;
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/trex_mps_XXXXXX";
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back(0);
  int fd = mkstemp(buf.data());
  if (fd < 0) {
    r.status = SolveResult::Error;
    r.message = "cannot create a temporary file for the MPS text";
    return r;
  }
  path = buf.data();
  const bool wrote = ::write(fd, text.data(), text.size()) == (ssize_t)text.size();
  ::close(fd);
  int fds[2];
  if (!wrote || ::pipe2(fds, O_CLOEXEC) != 0) {
    std::remove(path.c_str());
    r.status = SolveResult::Error;
    r.message = wrote ? "cannot create a pipe for the MPS reader" : "cannot write the MPS text to a temporary file";
    return r;
  }
  std::fflush(nullptr);  // nothing buffered twice
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child: default signal actions and no stderr, so that a crash of CoinMpsIO just ends it.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, SIG_DFL);
    if (int dn = ::open("/dev/null", O_WRONLY); dn >= 0) ::dup2(dn, 2);
    ::close(fds[0]);
    LpModel cm;
    SolveResult cr;
    try {
      cr = read_mps_coin(path, cm);
    } catch (const CoinError& e) {
      cr = SolveResult{};
      cr.status = SolveResult::ParseError;
      cr.message = "COIN error in " + e.className() + "::" + e.methodName() + ": " + e.message();
    } catch (...) {
      cr = SolveResult{};
      cr.status = SolveResult::ParseError;
      cr.message = "the MPS reader failed";
    }
    WireOut w;
    put_read(w, cr, cm);
    for (size_t off = 0; off < w.b.size();) {
      const ssize_t n = ::write(fds[1], w.b.data() + off, w.b.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) ::_exit(3);
      off += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  if (pid > 0) {
    char chunk[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got.append(chunk, static_cast<size_t>(n));
    }
  }
  ::close(fds[0]);
  int st = 0;
  if (pid > 0)
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
  std::remove(path.c_str());
  if (pid < 0) {
    r.status = SolveResult::Error;
    r.message = "cannot start the MPS reader (fork failed)";
    return r;
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    r.status = SolveResult::ParseError;
    r.message = WIFSIGNALED(st) ? "the MPS reader (COIN-OR CoinMpsIO) crashed on this text (signal " +
                                      std::to_string(WTERMSIG(st)) + "); check the MPS syntax"
                                : "the MPS reader exited with status " + std::to_string(WEXITSTATUS(st));
    return r;
  }
  WireIn in{got};
  if (!get_read(in, r, m)) {
    r = SolveResult{};
    r.status = SolveResult::Error;
    r.message = "corrupt reply from the MPS reader";
  }
  return r;
}

class CbcSolver final : public Solver {
 public:
  std::string name() const override { return "cbc"; }
  SolveResult solve_model(const LpModel& m, double time_limit_s) override {
    return guarded([&] { return solve_impl(m, time_limit_s); });
  }
  SolveResult solve_lp_text(const std::string& text, double time_limit_s) override {
    return guarded([&] {
      LpParseResult p = parse_lp(text);
      if (!p.ok) {
        SolveResult r;
        r.status = SolveResult::ParseError;
        r.message = "line " + std::to_string(p.line) + ": " + p.error;
        r.line = p.line;
        return r;
      }
      return solve_impl(p.model, time_limit_s);
    });
  }
  SolveResult solve_mps_text(const std::string& text, double time_limit_s) override {
    return guarded([&] {
      LpModel m;
      SolveResult rd = read_mps(text, m);
      if (rd.status != SolveResult::Optimal) return rd;
      return solve_impl(m, time_limit_s);
    });
  }
};

}  // namespace

std::unique_ptr<Solver> make_cbc_solver() { return std::make_unique<CbcSolver>(); }

}  // namespace trex::orx
