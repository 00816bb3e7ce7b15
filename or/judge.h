// Pass@1 judge for OR modelling: take a model's output text, extract its model (an LP or MPS block,
// or a Python solver program: or/code_judge.h), solve / run it and compare the optimum with the
// truth. Which block: a fenced LP / MPS block first, then a Python program, then a bare LP.
//   strict:  |pred - truth| / (|truth| + 1) < 1e-6
//   lenient: |pred - truth| <= 0.05 |truth|  (5% relative; strict also counts as lenient)
//   a truth of "infeasible" ("unbounded") matches an Infeasible (Unbounded) solve, under both rules.
// Outputs come from an OutputSource: PredictionsSource reads them from a JSONL file; a model
// runner is another OutputSource.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "or/code_judge.h"
#include "or/sandbox.h"
#include "or/solver.h"

namespace trex::orx {

struct Truth {
  enum Kind { Number, Infeasible, Unbounded, Unreadable } kind = Unreadable;
  double value = 0;
};
// A number (or numeric string such as "1,234.5" or "$12"), or "infeasible" / "unbounded"
// (also "no feasible solution", "no best solution" -> Infeasible), case-insensitive.
Truth parse_truth(const nlohmann::json& v);
std::string truth_text(const Truth& t);

struct ExtractedLp {
  bool found = false;
  std::string lp;
  std::string how;  // "fenced_lp" | "fenced_mps" | "fenced" (other fence holding an LP / MPS) | "bare" | "none"
  bool mps = false;  // the block is MPS (```mps, or a fence whose first line is NAME / ROWS)
};
// The last ```lp (or ```cplex) fenced block; else the last ```mps fence (or untagged fence starting
// with NAME / ROWS: mps = true); else the last fenced block that starts with an objective keyword; else a bare block from the last line starting with Maximize/Minimize
// (or Max/Min...) up to its End line (or the end of the text). An unclosed final fence counts.
ExtractedLp extract_lp(const std::string& output);

bool strict_match(double pred, double truth);
bool lenient_match(double pred, double truth);

// A data set's answer rule (or/formats.h names them). plus_one (trex): strict_match / lenient_match
// above. Otherwise strict: |p - t| <= strict_rel |t| (|p| <= strict_abs at t = 0), or with
// strict_absolute |p - t| < strict_abs (strictly less) at every t; lenient: strict, or after
// rounding both to integers when `round`, |p - t| <= lenient_rel |t| (|p| <= lenient_abs at t = 0).
// strict_rel = strict_abs = 0 is exact equality.
struct MatchRule {
  std::string name = "trex";
  bool plus_one = true;
  bool round = false;
  bool strict_absolute = false;
  double strict_rel = 1e-6, strict_abs = 1e-6;
  double lenient_rel = 0.05, lenient_abs = 0.0;
};
bool rule_match(const MatchRule& r, bool strict, double pred, double truth);

struct Verdict {
  ExtractedLp lp;
  ExtractedCode code;
  std::string kind = "none";  // "lp" | "mps" | "python" | "none"
  bool parsed = false;  // a model was found and it parsed (LP / MPS read; Python compiled)
  bool solved = false;  // the solver reached a verdict: optimal, infeasible or unbounded
  SolveResult result;
  bool strict = false, lenient = false;
  std::string objective_source;  // python: where the objective came from (or/code_judge.h)
  std::string isolation;         // python: the sandbox's isolation
  std::string limit;             // python, failure "timeout": "cpu" | "wall" | "solver" (CodeVerdict::limit)
  // "" (strictly right) | "no_model" (no code / LP / MPS found) | "parse_error" | "runtime_error" |
  // "timeout" | "infeasible" / "unbounded" (the model's verdict, the truth a number) | "wrong_value"
  // (a value or verdict other than the truth; lenient may still hold) | "solver_unavailable" |
  // "no_answer" | "sandbox_error" | "solver_error"
  std::string failure;
};
// How outputs are judged beyond the solver: the answer rule and, for Python programs, the
// interpreter (null: programs fail as "solver_unavailable") and the sandbox's limits.
struct JudgeSetup {
  MatchRule rule;
  const PythonEnv* python = nullptr;
  SandboxLimits sandbox;
};
Verdict judge_output(const std::string& output, const Truth& truth, Solver& solver, double time_limit_s);
Verdict judge_output(const std::string& output, const Truth& truth, Solver& solver, double time_limit_s,
                     const JudgeSetup& setup);

// ---- evaluation over a data set ----------------------------------------------------------
struct Problem {
  std::string id, question, category, family;
  Truth truth;
  MatchRule rule;  // the data set's answer rule (or/formats.h)
};

struct EvalOptions {
  std::string question_field;  // empty: question, en_question, problem, prompt (first present)
  std::string answer_field;    // empty: answer, en_answer, ground_truth, label
  double time_limit_s = 20;
  // Samples per problem (or/pass_at_k.h): 1 = Pass@1 of one output each; n > 1 = pass@k for each
  // k of `ks` (k <= n; 1 is always reported) and the majority vote over the n answers.
  int64_t samples = 1;
  std::vector<int64_t> ks;
  // Public set layout (or/formats.h): "" or "auto" = detect from the fields, else a name.
  std::string format;
  std::string python;       // interpreter for Python outputs ("" = find_python's default)
  SandboxLimits sandbox;    // limits of each program run
};
// The problems of `path`: a JSON file holding an array of objects (or an object with one array
// field), or JSONL (one object per line). Records without a question raise a UserError.
std::vector<Problem> load_problems(const std::string& path, const EvalOptions& o);

class OutputSource {
 public:
  virtual ~OutputSource() = default;
  // The model output for problem `p` (index `i` in the data set).
  virtual std::string output(const Problem& p, size_t i) = 0;
  // n outputs for problem `p` (evaluate() with EvalOptions::samples = n). Default: output() n times.
  virtual std::vector<std::string> samples(const Problem& p, size_t i, int64_t n);
};

// Outputs from a JSONL file: field output | prediction | response | completion | generated |
// text (a string), or a list of strings in outputs | samples | completions | responses |
// predictions (several samples of one problem); matched to problems by "id" when both files carry
// ids, else by line order. Samples of a problem: its lines' outputs in file order (lines repeating an
// id add samples), the first n used; a problem with fewer than n is judged with empty outputs for
// the rest (fails), counted in short_samples().
class PredictionsSource final : public OutputSource {
 public:
  explicit PredictionsSource(const std::string& path);
  std::string output(const Problem& p, size_t i) override;
  std::vector<std::string> samples(const Problem& p, size_t i, int64_t n) override;
  int64_t short_samples() const { return short_; }
  size_t size() const { return by_line_.size(); }

  // How the predictions pair with the problems of a data set. by_id: matched by "id" (any
  // prediction carries one), else by line order. Each problem without a prediction is judged on
  // an empty output (a fail).
  struct Match {
    bool by_id = false;
    size_t problems = 0, predictions = 0;
    size_t missing = 0;         // problems with no prediction
    size_t extra = 0;           // predictions that match no problem (by id: unknown ids; by line: past the end)
    size_t duplicate_ids = 0;   // prediction lines whose id an earlier line had (the last one is used)
    size_t without_id = 0;      // by id: prediction lines without an id (never used)
    std::vector<std::string> examples;  // up to 5 ids / lines of the mismatches, for the message
    bool ok() const { return !missing && !extra && !duplicate_ids && !without_id; }
    std::string str() const;    // one line: the counts and the examples
  };
  // repeats_are_samples: lines repeating an id are further samples, not duplicates.
  Match match(const std::vector<Problem>& problems, bool repeats_are_samples = false) const;

 private:
  std::vector<std::vector<std::string>> line_outputs_;  // [lines] every output of each line
  std::map<std::string, std::vector<std::string>> all_by_id_;  // every output of each id, in file order
  int64_t short_ = 0;
  std::vector<std::string> by_line_;
  std::vector<std::string> line_ids_;  // [lines] the id of each prediction line ("" = none)
  std::map<std::string, std::string> by_id_;
};

struct EvalCounts {
  int64_t n = 0;  // problems
  // Judged outputs (n x samples) with an LP found, parsed, solved, strictly / leniently right.
  int64_t outputs = 0, lp_found = 0, parsed = 0, solved = 0, strict = 0, lenient = 0;
  // samples > 1: sums over the problems of pass@k (by k), and problems whose majority answer is right.
  std::map<int64_t, double> passk_strict, passk_lenient;
  int64_t maj_strict = 0, maj_lenient = 0;
  std::map<std::string, int64_t> failures;  // Verdict::failure -> judged outputs that failed that way
  std::map<std::string, int64_t> kinds;     // Verdict::kind -> judged outputs
};
struct EvalSummary {
  EvalCounts all;
  std::map<std::string, EvalCounts> per_category;
  std::map<std::string, std::string> rules;  // category -> MatchRule::name used for it
  int64_t unreadable_truth = 0;  // problems skipped because their answer could not be read
  int64_t samples = 1;           // EvalOptions::samples
  double seconds = 0;
};

// Judges every problem; writes one JSON line per problem to `results` when given.
EvalSummary evaluate(const std::vector<Problem>& problems, OutputSource& src, const EvalOptions& o, std::ostream* results);
std::string format_summary(const EvalSummary& s);  // human-readable table
nlohmann::ordered_json summary_json(const EvalSummary& s);

}  // namespace trex::orx
