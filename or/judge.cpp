#include "or/judge.h"
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include "core/error.h"
#include "core/timer.h"
#include "or/formats.h"
#include "or/pass_at_k.h"

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
std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> v;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find('\n', b);
    if (e == std::string::npos) e = s.size();
    std::string l = s.substr(b, e - b);
    if (!l.empty() && l.back() == '\r') l.pop_back();
    v.push_back(l);
    b = e + 1;
  }
  return v;
}
// First word of a line, lower case, trailing ':' dropped.
std::string first_word(const std::string& line) {
  std::string t = trim(line), w;
  for (char c : t) {
    if (std::isspace((unsigned char)c) || c == ':') break;
    w += (char)std::tolower((unsigned char)c);
  }
  return w;
}
bool objective_line(const std::string& line) {
  static const char* kw[] = {"maximize", "maximise", "maximum", "max", "minimize", "minimise", "minimum", "min"};
  const std::string w = first_word(line);
  for (const char* k : kw)
    if (w == k) return true;
  return false;
}
// Whether a block's first meaningful line (skipping blanks and \ comments) is an objective keyword.
bool starts_like_lp(const std::string& text) {
  for (const auto& l : split_lines(text)) {
    const std::string t = trim(l);
    if (t.empty() || t[0] == '\\') continue;
    return objective_line(t);
  }
  return false;
}
// An MPS file: the first meaningful line (skipping blanks and * comments) is NAME or ROWS.
bool starts_like_mps(const std::string& text) {
  for (const auto& l : split_lines(text)) {
    const std::string t = trim(l);
    if (t.empty() || t[0] == '*') continue;
    const std::string w = first_word(t);
    return (w == "name" || w == "rows") && l[0] != ' ' && l[0] != '\t';
  }
  return false;
}
std::string join_lines(const std::vector<std::string>& v, size_t b, size_t e) {
  std::string s;
  for (size_t i = b; i < e && i < v.size(); ++i) s += v[i] + "\n";
  return s;
}

}  // namespace

Truth parse_truth(const nlohmann::json& v) {
  Truth t;
  if (v.is_number()) {
    t.kind = Truth::Number;
    t.value = v.get<double>();
    return t;
  }
  if (!v.is_string()) return t;
  const std::string s = lower(trim(v.get<std::string>()));
  if (s.find("infeasib") != std::string::npos || s == "no feasible solution" || s == "no best solution" || s == "no solution") {
    t.kind = Truth::Infeasible;
    return t;
  }
  if (s.find("unbounded") != std::string::npos) {
    t.kind = Truth::Unbounded;
    return t;
  }
  std::string num;
  for (char c : s)
    if (c != ',' && c != '$' && c != ' ' && c != '%') num += c;
  char* end = nullptr;
  const double x = std::strtod(num.c_str(), &end);
  if (!num.empty() && end && *end == 0 && std::isfinite(x)) {
    t.kind = Truth::Number;
    t.value = x;
  }
  return t;
}

std::string truth_text(const Truth& t) {
  switch (t.kind) {
    case Truth::Number: {
      char b[64];
      std::snprintf(b, sizeof b, "%.12g", t.value);
      return b;
    }
    case Truth::Infeasible: return "infeasible";
    case Truth::Unbounded: return "unbounded";
    default: return "unreadable";
  }
}

ExtractedLp extract_lp(const std::string& output) {
  ExtractedLp r;
  r.how = "none";
  const auto lines = split_lines(output);
  struct Fence {
    std::string lang, body;
  };
  std::vector<Fence> fences;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string t = trim(lines[i]);
    if (t.rfind("```", 0) != 0) continue;
    Fence f;
    f.lang = lower(trim(t.substr(3)));
    size_t j = i + 1;
    while (j < lines.size() && trim(lines[j]).rfind("```", 0) != 0) ++j;
    f.body = join_lines(lines, i + 1, j);
    fences.push_back(f);
    i = j;  // the closing fence (or the end)
  }
  for (auto it = fences.rbegin(); it != fences.rend(); ++it)
    if (it->lang == "lp" || it->lang == "cplex" || it->lang == "cplex-lp" || it->lang == "cplex_lp") {
      r.found = true;
      r.lp = it->body;
      r.how = "fenced_lp";
      return r;
    }
  for (auto it = fences.rbegin(); it != fences.rend(); ++it)
    if (it->lang == "mps" || it->lang == "freemps" || (it->lang.empty() && starts_like_mps(it->body))) {
      r.found = r.mps = true;
      r.lp = it->body;
      r.how = it->lang.empty() ? "fenced" : "fenced_mps";
      return r;
    }
  for (auto it = fences.rbegin(); it != fences.rend(); ++it)
    if (starts_like_lp(it->body)) {
      r.found = true;
      r.lp = it->body;
      r.how = "fenced";
      return r;
    }
  // Bare: the last objective line that has an End line after it, else the last objective line.
  int start = -1, fallback = -1;
  for (int i = (int)lines.size() - 1; i >= 0; --i) {
    if (!objective_line(lines[i])) continue;
    if (fallback < 0) fallback = i;
    for (size_t j = i + 1; j < lines.size(); ++j)
      if (first_word(lines[j]) == "end" && trim(lines[j]).size() <= 4) {
        start = i;
        break;
      }
    if (start >= 0) break;
  }
  if (start < 0) start = fallback;
  if (start < 0) return r;
  size_t end = lines.size();
  for (size_t j = start + 1; j < lines.size(); ++j)
    if (first_word(lines[j]) == "end" && trim(lines[j]).size() <= 4) {
      end = j + 1;
      break;
    }
  r.found = true;
  r.lp = join_lines(lines, start, end);
  r.how = "bare";
  return r;
}

bool strict_match(double pred, double truth) { return std::fabs(pred - truth) / (std::fabs(truth) + 1) < 1e-6; }
bool lenient_match(double pred, double truth) { return strict_match(pred, truth) || std::fabs(pred - truth) <= 0.05 * std::fabs(truth); }

bool rule_match(const MatchRule& r, bool strict, double pred, double truth) {
  if (r.plus_one) return strict ? strict_match(pred, truth) : lenient_match(pred, truth);
  auto within = [](double p, double t, double rel, double abs0) {
    return t == 0 ? std::fabs(p) <= abs0 : std::fabs(p - t) <= rel * std::fabs(t);
  };
  const bool s = r.strict_absolute ? std::fabs(pred - truth) < r.strict_abs : within(pred, truth, r.strict_rel, r.strict_abs);
  if (strict || s) return s;
  return r.round ? within(std::round(pred), std::round(truth), r.lenient_rel, r.lenient_abs)
                 : within(pred, truth, r.lenient_rel, r.lenient_abs);
}

Verdict judge_output(const std::string& output, const Truth& truth, Solver& solver, double time_limit_s) {
  return judge_output(output, truth, solver, time_limit_s, JudgeSetup{});
}

namespace {
// The verdict's failure kind (strict): see Verdict::failure.
std::string failure_kind(const Verdict& v, const Truth& truth) {
  if (v.strict) return "";
  const auto st = v.result.status;
  if (st == SolveResult::Optimal) return "wrong_value";
  if (st == SolveResult::Infeasible) return truth.kind == Truth::Number ? "infeasible" : "wrong_value";
  if (st == SolveResult::Unbounded) return truth.kind == Truth::Number ? "unbounded" : "wrong_value";
  if (st == SolveResult::ParseError) return "parse_error";
  if (st == SolveResult::TimeLimit) return "timeout";
  return "solver_error";
}
}  // namespace

Verdict judge_output(const std::string& output, const Truth& truth, Solver& solver, double time_limit_s,
                     const JudgeSetup& setup) {
  Verdict v;
  v.lp = extract_lp(output);
  // A fenced LP / MPS block first; then a Python program; then a bare LP.
  const bool fenced = v.lp.found && v.lp.how != "bare";
  if (!fenced) v.code = extract_code(output);
  if (!fenced && v.code.found) {
    v.kind = "python";
    v.lp = ExtractedLp{};
    v.lp.how = "none";
    CodeVerdict c = run_solver_code(v.code.code, setup.python ? *setup.python : PythonEnv{}, setup.sandbox);
    if (!setup.python) c.result.message = "Python outputs are not run here";
    v.result = c.result;
    v.objective_source = c.objective_source;
    v.isolation = c.isolation;
    v.limit = c.limit;
    v.parsed = c.failure != "parse_error" && c.failure != "solver_unavailable";
    v.failure = c.failure;
  } else if (!v.lp.found) {
    v.result.status = SolveResult::ParseError;
    v.result.message = "no LP, MPS or Python model found in the output";
    v.failure = "no_model";
    return v;
  } else {
    v.kind = v.lp.mps ? "mps" : "lp";
    v.result = v.lp.mps ? solver.solve_mps_text(v.lp.lp, time_limit_s) : solver.solve_lp_text(v.lp.lp, time_limit_s);
    v.parsed = v.result.status != SolveResult::ParseError;
  }
  const auto st = v.result.status;
  v.solved = v.failure.empty() && (st == SolveResult::Optimal || st == SolveResult::Infeasible || st == SolveResult::Unbounded);
  if (v.solved && truth.kind == Truth::Number && st == SolveResult::Optimal) {
    v.strict = rule_match(setup.rule, true, v.result.objective, truth.value);
    v.lenient = rule_match(setup.rule, false, v.result.objective, truth.value);
  } else if (v.solved && ((truth.kind == Truth::Infeasible && st == SolveResult::Infeasible) ||
                          (truth.kind == Truth::Unbounded && st == SolveResult::Unbounded))) {
    v.strict = v.lenient = true;
  }
  if (v.failure.empty()) v.failure = failure_kind(v, truth);
  return v;
}

std::vector<Problem> load_problems(const std::string& path, const EvalOptions& o) {
  bool array = false;
  const auto records = read_records(path, &array);
  std::vector<Problem> out;
  if (records.empty()) return out;
  const DataFormat& fmt = detect_format(o.format, path, records.front().first);
  auto field = [](const nlohmann::json& j, const std::string& forced, const std::vector<std::string>& names) -> const nlohmann::json* {
    if (!forced.empty()) return j.contains(forced) ? &j[forced] : nullptr;
    for (const std::string& n : names)
      if (j.contains(n)) return &j[n];
    return nullptr;
  };
  for (const auto& [j, ln] : records) {
    const std::string where = path + (array ? " record " : ":") + std::to_string(ln);
    // A mixed file names each record's set: its rule and its row in the summary.
    const DataFormat* f = &fmt;
    std::string set;
    for (const char* k : {"benchmark", "dataset"})
      if (j.contains(k) && j[k].is_string()) {
        const std::string n = format_from_name(j[k].get<std::string>());
        if (!n.empty()) f = &format_by_name(n), set = n;
      }
    const nlohmann::json* q = field(j, o.question_field, f->question_fields);
    const nlohmann::json* a = field(j, o.answer_field, f->answer_fields);
    TREX_USER_CHECK(q && q->is_string(), "name the question field with --question-field (or pick the layout with --format)",
                    where, ": no question field (", f->name, " layout looks for ", f->question_fields.front(), ")");
    Problem p;
    p.question = q->get<std::string>();
    if (a) p.truth = parse_truth(*a);
    // The public sets' numeric placeholder for "no optimal solution".
    if (f->name != "trex" && p.truth.kind == Truth::Number && p.truth.value == -99999) p.truth.kind = Truth::Infeasible;
    p.rule = f->rule;
    const nlohmann::json* id = nullptr;
    for (const char* k : {"id", "question_id", "qid", "index"})
      if (!id && j.contains(k)) id = &j[k];
    p.id = id ? (id->is_string() ? id->get<std::string>() : id->dump()) : std::to_string(out.size());
    if (j.contains("category") && j["category"].is_string()) p.category = j["category"].get<std::string>();
    else if (!set.empty()) p.category = set;
    else if (fmt.name != "trex") p.category = fmt.name;
    else p.category = "all";
    p.family = j.contains("family") && j["family"].is_string() ? j["family"].get<std::string>() : "";
    out.push_back(std::move(p));
  }
  return out;
}

PredictionsSource::PredictionsSource(const std::string& path) {
  std::ifstream f(path);
  TREX_USER_CHECK(f.good(), "give an existing JSONL file with --predictions", "cannot read ", path);
  std::string line;
  int ln = 0;
  while (std::getline(f, line)) {
    ++ln;
    if (trim(line).empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      TREX_USER_FAIL("each line must be one JSON object", path, ":", ln, ": invalid JSON (", e.what(), ")");
    }
    std::vector<std::string> outs;
    for (const char* k : {"output", "prediction", "response", "completion", "generated", "text"})
      if (j.contains(k) && j[k].is_string()) {
        outs.push_back(j[k].get<std::string>());
        break;
      }
    if (outs.empty())
      for (const char* k : {"outputs", "samples", "completions", "responses", "predictions"})
        if (j.contains(k) && j[k].is_array()) {
          for (const nlohmann::json& o : j[k]) {
            TREX_USER_CHECK(o.is_string(), "give the samples as a list of strings", path, ":", ln, ": field ", k,
                            " holds a ", o.type_name(), ", not a string");
            outs.push_back(o.get<std::string>());
          }
          TREX_USER_CHECK(!outs.empty(), "give at least one sample", path, ":", ln, ": field ", k, " is empty");
          break;
        }
    TREX_USER_CHECK(!outs.empty(), "put the model text in an \"output\" field (or a list of samples in \"outputs\")",
                    path, ":", ln, ": no output field");
    std::string id;
    if (j.contains("id")) {
      id = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
      by_id_[id] = outs.front();
      std::vector<std::string>& all = all_by_id_[id];
      all.insert(all.end(), outs.begin(), outs.end());
    }
    line_ids_.push_back(id);
    by_line_.push_back(outs.front());
    line_outputs_.push_back(std::move(outs));
  }
}

PredictionsSource::Match PredictionsSource::match(const std::vector<Problem>& problems, bool repeats_are_samples) const {
  Match m;
  m.by_id = !by_id_.empty();
  m.problems = problems.size();
  m.predictions = by_line_.size();
  auto note = [&](const std::string& what) {
    if (m.examples.size() < 5) m.examples.push_back(what);
  };
  if (!m.by_id) {
    for (size_t i = by_line_.size(); i < problems.size(); ++i) ++m.missing, note("problem " + problems[i].id);
    for (size_t i = problems.size(); i < by_line_.size(); ++i) ++m.extra, note("prediction line " + std::to_string(i + 1));
    return m;
  }
  std::map<std::string, int> seen;
  for (size_t i = 0; i < line_ids_.size(); ++i) {
    const std::string& id = line_ids_[i];
    if (id.empty()) {
      ++m.without_id, note("prediction line " + std::to_string(i + 1) + " without id");
    } else if (seen[id]++ && !repeats_are_samples) {
      ++m.duplicate_ids, note("id " + id + " repeated");
    }
  }
  std::map<std::string, int> wanted;
  for (const Problem& p : problems) {
    ++wanted[p.id];
    if (!by_id_.count(p.id)) ++m.missing, note("id " + p.id + " has no prediction");
  }
  for (const auto& [id, out] : by_id_)
    if (!wanted.count(id)) ++m.extra, note("id " + id + " is not in the data");
  return m;
}

std::string PredictionsSource::Match::str() const {
  std::string s = detail::cat(predictions, " predictions for ", problems, " problems (matched by ",
                              by_id ? "id" : "line order", "): ", missing, " problems without a prediction (judged as "
                              "failed), ", extra, " predictions matching no problem");
  if (by_id) s += detail::cat(", ", duplicate_ids, " repeated ids, ", without_id, " prediction lines without an id");
  if (!examples.empty()) {
    s += "; e.g. ";
    for (size_t i = 0; i < examples.size(); ++i) s += (i ? "; " : "") + examples[i];
  }
  return s;
}

std::string PredictionsSource::output(const Problem& p, size_t i) {
  if (!by_id_.empty()) {
    auto it = by_id_.find(p.id);
    return it == by_id_.end() ? std::string() : it->second;
  }
  return i < by_line_.size() ? by_line_[i] : std::string();
}

std::vector<std::string> OutputSource::samples(const Problem& p, size_t i, int64_t n) {
  std::vector<std::string> r;
  for (int64_t j = 0; j < n; ++j) r.push_back(output(p, i));
  return r;
}

std::vector<std::string> PredictionsSource::samples(const Problem& p, size_t i, int64_t n) {
  std::vector<std::string> r;
  if (!all_by_id_.empty()) {
    auto it = all_by_id_.find(p.id);
    if (it != all_by_id_.end()) r = it->second;
  } else if (i < line_outputs_.size()) {
    r = line_outputs_[i];
  }
  if ((int64_t)r.size() < n) ++short_;
  r.resize(n);  // the first n; missing ones are empty (fail)
  return r;
}

namespace {

void count_verdict(EvalCounts& c, const Verdict& v) {
  ++c.outputs;
  if (!v.failure.empty()) ++c.failures[v.failure];
  ++c.kinds[v.kind];
  c.lp_found += v.kind != "none";  // a model found: LP, MPS or Python
  c.parsed += v.parsed;
  c.solved += v.solved;
  c.strict += v.strict;
  c.lenient += v.lenient;
}

nlohmann::ordered_json verdict_json(const Verdict& v) {
  nlohmann::ordered_json j;
  j["kind"] = v.kind;
  j["failure"] = v.failure.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(v.failure);
  j["lp_found"] = v.lp.found;
  j["extraction"] = v.kind == "python" ? v.code.how : v.lp.how;
  if (v.kind == "python") {
    j["objective_source"] = v.objective_source;
    j["isolation"] = v.isolation;
    if (!v.limit.empty()) j["limit"] = v.limit;
  }
  j["parsed"] = v.parsed;
  j["status"] = status_name(v.result.status);
  if (v.result.status == SolveResult::Optimal) j["objective"] = v.result.objective;
  else j["objective"] = nullptr;
  j["message"] = v.result.message;
  if (v.result.line) j["line"] = v.result.line;
  j["strict"] = v.strict;
  j["lenient"] = v.lenient;
  return j;
}

// The k values reported with n samples: 1, the requested ones (<= n), in increasing order.
std::vector<int64_t> report_ks(const EvalOptions& o) {
  std::vector<int64_t> ks = {1};
  for (int64_t k : o.ks) {
    TREX_USER_CHECK(k >= 1 && k <= o.samples, "give each k of pass@k between 1 and --samples", "pass@", k,
                    " needs k in [1, ", o.samples, "]");
    ks.push_back(k);
  }
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

// samples > 1: every sample judged; pass@k from the counts of right samples; the majority answer.
void evaluate_samples(const Problem& p, size_t i, OutputSource& src, const EvalOptions& o, const JudgeSetup& setup,
                      const std::vector<int64_t>& ks, EvalSummary& s, std::ostream* results) {
  const std::vector<std::string> outs = src.samples(p, i, o.samples);
  TREX_CHECK((int64_t)outs.size() == o.samples, "evaluate: ", outs.size(), " samples for problem ", p.id, ", wanted ",
             o.samples);
  std::vector<Verdict> vs;
  std::vector<SampleAnswer> answers;
  int64_t cs = 0, cl = 0;
  for (const std::string& out : outs) {
    auto solver = make_cbc_solver();  // a fresh solver per output
    vs.push_back(judge_output(out, p.truth, *solver, o.time_limit_s, setup));
    cs += vs.back().strict, cl += vs.back().lenient;
    answers.push_back({vs.back().result.status, vs.back().result.objective});
  }
  const int64_t maj = majority_sample(answers);
  for (EvalCounts* c : {&s.all, &s.per_category[p.category]}) {
    ++c->n;
    for (const Verdict& v : vs) count_verdict(*c, v);
    for (int64_t k : ks) {
      c->passk_strict[k] += pass_at_k(o.samples, cs, k);
      c->passk_lenient[k] += pass_at_k(o.samples, cl, k);
    }
    c->maj_strict += maj >= 0 && vs[maj].strict;
    c->maj_lenient += maj >= 0 && vs[maj].lenient;
  }
  if (!results) return;
  nlohmann::ordered_json j;
  j["id"] = p.id;
  j["category"] = p.category;
  if (!p.family.empty()) j["family"] = p.family;
  j["truth"] = truth_text(p.truth);
  j["n_strict"] = cs;
  j["n_lenient"] = cl;
  j["majority_sample"] = maj;  // index into samples, -1: no sample reached a verdict
  j["majority_strict"] = maj >= 0 && vs[maj].strict;
  j["majority_lenient"] = maj >= 0 && vs[maj].lenient;
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (size_t k = 0; k < vs.size(); ++k) {
    nlohmann::ordered_json x = verdict_json(vs[k]);
    x["output"] = outs[k];
    arr.push_back(x);
  }
  j["samples"] = arr;
  *results << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

}  // namespace

EvalSummary evaluate(const std::vector<Problem>& problems, OutputSource& src, const EvalOptions& o, std::ostream* results) {
  const double t0 = now_ms();
  EvalSummary s;
  TREX_USER_CHECK(o.samples >= 1, "use --samples >= 1", "or eval: --samples ", o.samples);
  s.samples = o.samples;
  const std::vector<int64_t> ks = report_ks(o);
  // The interpreter for Python outputs, looked up once at the first program (a missing one makes
  // every program "solver_unavailable", with the reason in its message).
  PythonEnv py;
  bool py_looked = false;
  for (size_t i = 0; i < problems.size(); ++i) {
    const Problem& p = problems[i];
    if (p.truth.kind == Truth::Unreadable) {
      ++s.unreadable_truth;
      continue;
    }
    JudgeSetup setup;
    setup.rule = p.rule;
    s.rules[p.category] = p.rule.name;
    setup.sandbox = o.sandbox;
    if (!py_looked) {
      py = find_python(o.python);
      py_looked = true;
    }
    setup.python = &py;
    if (o.samples > 1) {
      evaluate_samples(p, i, src, o, setup, ks, s, results);
      continue;
    }
    const std::string out = src.output(p, i);
    auto solver = make_cbc_solver();  // a fresh solver per problem
    const Verdict v = judge_output(out, p.truth, *solver, o.time_limit_s, setup);
    for (EvalCounts* c : {&s.all, &s.per_category[p.category]}) {
      ++c->n;
      count_verdict(*c, v);
    }
    if (results) {
      nlohmann::ordered_json j;
      j["id"] = p.id;
      j["category"] = p.category;
      if (!p.family.empty()) j["family"] = p.family;
      j["truth"] = truth_text(p.truth);
      j["output"] = out;
      j.update(verdict_json(v));
      *results << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
  }
  s.seconds = (now_ms() - t0) / 1000.0;
  return s;
}

namespace {
double pct(int64_t a, int64_t n) { return n ? 100.0 * a / n : 0.0; }
// One sample per problem: Pass@1 and the shares of outputs found / parsed / solved.
// Several: pass@k (mean over the problems, %) for each k, the majority vote's Pass@1, and the
// shares over all judged outputs.
nlohmann::ordered_json counts_json(const EvalCounts& c, int64_t samples) {
  nlohmann::ordered_json j;
  j["n"] = c.n;
  if (samples <= 1) {
    j["pass1_strict"] = pct(c.strict, c.n);
    j["pass1_lenient"] = pct(c.lenient, c.n);
  } else {
    j["samples"] = samples;
    nlohmann::ordered_json pk = nlohmann::ordered_json::object();
    for (const auto& [k, v] : c.passk_strict)
      pk[std::to_string(k)] = {{"strict", c.n ? 100.0 * v / c.n : 0.0},
                               {"lenient", c.n ? 100.0 * c.passk_lenient.at(k) / c.n : 0.0}};
    j["pass_at_k"] = pk;
    j["majority_strict"] = pct(c.maj_strict, c.n);
    j["majority_lenient"] = pct(c.maj_lenient, c.n);
    j["outputs"] = c.outputs;
  }
  j["lp_found"] = pct(c.lp_found, c.outputs);
  j["parsed"] = pct(c.parsed, c.outputs);
  j["solved"] = pct(c.solved, c.outputs);
  j["kinds"] = c.kinds;
  j["failures"] = c.failures;
  return j;
}
}  // namespace

nlohmann::ordered_json summary_json(const EvalSummary& s) {
  nlohmann::ordered_json j = counts_json(s.all, s.samples);
  nlohmann::ordered_json per = nlohmann::ordered_json::object();
  for (const auto& [k, c] : s.per_category) per[k] = counts_json(c, s.samples);
  j["per_category"] = per;
  j["rules"] = s.rules;
  j["unreadable_truth"] = s.unreadable_truth;
  j["seconds"] = s.seconds;
  return j;
}

std::string format_summary(const EvalSummary& s) {
  std::string out;
  char buf[512];
  if (s.samples <= 1) {
    std::snprintf(buf, sizeof buf, "%-14s %6s %9s %9s %8s %8s %8s\n", "category", "n", "strict%", "lenient%", "found%",
                  "parsed%", "solved%");
    out += buf;
  } else {
    std::string head = detail::cat(s.samples, " samples per problem; pass@k strict% / lenient%, then the majority vote's\n");
    out += head;
    std::snprintf(buf, sizeof buf, "%-14s %6s", "category", "n");
    out += buf;
    for (const auto& [k, v] : s.all.passk_strict) {
      std::snprintf(buf, sizeof buf, " %15s", ("pass@" + std::to_string(k)).c_str());
      out += buf;
    }
    std::snprintf(buf, sizeof buf, " %15s %8s %8s %8s\n", "majority", "found%", "parsed%", "solved%");
    out += buf;
  }
  auto row = [&](const std::string& name, const EvalCounts& c) {
    if (s.samples <= 1) {
      std::snprintf(buf, sizeof buf, "%-14s %6lld %9.2f %9.2f %8.2f %8.2f %8.2f\n", name.c_str(), (long long)c.n,
                    pct(c.strict, c.n), pct(c.lenient, c.n), pct(c.lp_found, c.outputs), pct(c.parsed, c.outputs),
                    pct(c.solved, c.outputs));
      out += buf;
      return;
    }
    std::snprintf(buf, sizeof buf, "%-14s %6lld", name.c_str(), (long long)c.n);
    out += buf;
    for (const auto& [k, v] : c.passk_strict) {
      std::snprintf(buf, sizeof buf, " %7.2f/%7.2f", c.n ? 100.0 * v / c.n : 0.0,
                    c.n ? 100.0 * c.passk_lenient.at(k) / c.n : 0.0);
      out += buf;
    }
    std::snprintf(buf, sizeof buf, " %7.2f/%7.2f %8.2f %8.2f %8.2f\n", pct(c.maj_strict, c.n), pct(c.maj_lenient, c.n),
                  pct(c.lp_found, c.outputs), pct(c.parsed, c.outputs), pct(c.solved, c.outputs));
    out += buf;
  };
  for (const auto& [k, c] : s.per_category) row(k, c);
  row("all", s.all);
  {
    out += "answer rules:";
    for (const auto& [k, r] : s.rules) out += " " + k + "=" + r;
    out += " (docs/OR.md)\n";
  }
  if (!s.all.failures.empty()) {
    out += "failures (judged outputs):";
    for (const auto& [k, n] : s.all.failures) out += " " + k + " " + std::to_string(n);
    out += "\n";
  }
  if (s.unreadable_truth) out += "skipped " + std::to_string(s.unreadable_truth) + " problems whose answer could not be read\n";
  return out;
}

}  // namespace trex::orx
