// The sandboxed MPS reader (see mps_reader.h): the child process reads the text with CoinMpsIO
// and sends the model back through a pipe in a small wire format.
#include "or/mps_reader.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <coin/CoinFinite.hpp>
#include <coin/CoinMessageHandler.hpp>
#include <coin/CoinMpsIO.hpp>
#include <coin/CoinPackedMatrix.hpp>
#include "or/mps_text.h"

namespace trex::orx {

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

}  // namespace

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

}  // namespace trex::orx
