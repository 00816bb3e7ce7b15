#include "or/dataset.h"
#include <cmath>
#include <cstdio>
#include <filesystem>
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "io/atomic_file.h"

namespace trex::orx {

namespace {

// A solution value for prose: at most 6 decimals, no trailing zeros, no "-0".
std::string value_text(double v) {
  if (std::fabs(v) < 5e-7) return "0";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

std::string amount(const Instance& in, double v) {
  if (!in.money) return value_text(v);
  if (in.currency == "EUR") return value_text(v) + " euros";
  return (v < 0 ? "-" : "") + in.currency + value_text(std::fabs(v));
}

std::string title(const std::string& s) {
  std::string t = s;
  for (auto& ch : t)
    if (ch == '_') ch = ' ';
  if (!t.empty()) t[0] = (char)std::toupper((unsigned char)t[0]);
  return t;
}

std::string lp_block(const std::string& lp) { return "```lp\n" + lp + "```\n"; }

std::string pick(uint64_t seed, std::initializer_list<const char*> v) { return *(v.begin() + Rng(seed).next_u64() % v.size()); }

}  // namespace

const char* task_name(SftTask t) {
  switch (t) {
    case SftTask::StatementToFormulationLp: return "statement_to_formulation_lp";
    case SftTask::FormulationToLp: return "formulation_to_lp";
    case SftTask::StatementToLpAnswer: return "statement_to_lp_answer";
  }
  return "?";
}

const std::string& solve_instruction() {
  static const std::string s =
      "Write a model of this problem in CPLEX LP format inside a ```lp code block; a solver will run it. "
      "Then state the optimal objective value, or say that the problem is infeasible or unbounded.";
  return s;
}

std::string eval_prompt(const std::string& question) { return question + "\n\n" + solve_instruction(); }

nlohmann::ordered_json label_json(const SolveResult& r) {
  if (r.status == SolveResult::Optimal) {
    const double v = std::stod(label_text(r));
    if (v == std::round(v) && std::fabs(v) < 1e15) return (int64_t)v;
    return v;
  }
  return label_text(r);
}

std::string cpt_document(const Instance& in) {
  std::string d = "# " + title(in.family) + " problem (" + (in.category == "lp" ? "linear programming" : in.category == "ip" ? "integer programming"
                                                              : in.category == "network" ? "network optimization" : "scheduling and covering") + ")\n\n";
  d += "## Problem\n\n" + in.statement + "\n\n## Mathematical formulation\n\n" + in.formulation +
       "\n## Solver-ready model (CPLEX LP format)\n\n" + lp_block(in.lp) + "\n## Solution\n\n";
  const SolveResult& r = in.result;
  if (r.status == SolveResult::Infeasible) {
    d += "The solver proves that the model is infeasible: no choice of the decision variables satisfies every constraint";
    d += in.reason.empty() ? ".\n" : ", because " + in.reason + ".\n";
    d += "The correct answer to the question is therefore \"infeasible\"; the requirements would have to be relaxed before any plan exists.\n";
    return d;
  }
  if (r.status == SolveResult::Unbounded) {
    d += "The solver reports that the model is unbounded: the objective can be improved without limit";
    d += in.reason.empty() ? ".\n" : ", because " + in.reason + ".\n";
    d += "The correct answer is therefore \"unbounded\"; in practice such a result points to a missing limit in the model.\n";
    return d;
  }
  d += "Solving the model (CBC) gives the optimal " + in.obj_desc + ": " + amount(in, r.objective) + ".\n\n";
  std::vector<double> x(in.model.vars.size(), 0.0);
  for (size_t j = 0; j < r.values.size() && j < x.size(); ++j) x[j] = r.values[j].second;
  int shown = 0, nonzero = 0;
  std::string list;
  for (size_t j = 0; j < x.size(); ++j) {
    if (std::fabs(x[j]) < 5e-7) continue;
    ++nonzero;
    if (shown++ < 30) list += "- " + in.model.vars[j].name + " = " + value_text(x[j]) + " (" + in.var_desc[j] + ")\n";
  }
  if (nonzero == 0) d += "At the optimum every decision variable is zero.\n";
  else d += "Decisions at the optimum (variables not listed are zero):\n" + list + (nonzero > shown ? "- ... and " + std::to_string(nonzero - shown) + " more\n" : "");
  std::string binding, slack;
  int nb = 0, ns = 0;
  for (size_t i = 0; i < in.model.rows.size(); ++i) {
    const LpRow& row = in.model.rows[i];
    double act = 0;
    for (const auto& t : row.terms) act += t.coef * x[t.var];
    const double lo = row.lower(), hi = row.upper();
    const bool at_lo = !lp_is_inf(lo) && std::fabs(act - lo) <= 1e-6 * (1 + std::fabs(lo));
    const bool at_hi = !lp_is_inf(hi) && std::fabs(act - hi) <= 1e-6 * (1 + std::fabs(hi));
    if (row.sense == RowSense::EQ) continue;
    if (at_lo || at_hi) {
      if (nb++ < 20) binding += "- " + row.name + ": " + in.row_desc[i] + " (value " + value_text(act) + ")\n";
    } else {
      const double gap = lp_is_inf(hi) ? act - lo : hi - act;
      if (ns++ < 20) slack += "- " + row.name + ": " + in.row_desc[i] + " (value " + value_text(act) + ", slack " + value_text(gap) + ")\n";
    }
  }
  if (!binding.empty()) d += "\nBinding constraints (they limit the optimum):\n" + binding;
  if (!slack.empty()) d += "\nConstraints with slack (not limiting):\n" + slack;
  d += "\nIn short: the best achievable " + in.obj_desc + " is " + amount(in, r.objective) + ".\n";
  return d;
}

nlohmann::ordered_json sft_record(const Instance& in, SftTask task, int64_t index) {
  const uint64_t s = in.seed ^ 0x5F7ull;
  std::string user, assistant;
  switch (task) {
    case SftTask::StatementToFormulationLp:
      user = in.statement + "\n\n" +
             pick(s, {"Formulate this as an optimization model: give the sets, parameters, decision variables, objective and constraints, "
                      "then the complete model in CPLEX LP format inside a ```lp block.",
                      "Write the algebraic model of this problem, followed by a solver-ready CPLEX LP file in a ```lp code block.",
                      "Model this problem mathematically, then translate the model into an LP file (CPLEX LP format, fenced as ```lp)."});
      assistant = "Formulation:\n\n" + in.formulation + "\nLP file:\n\n" + lp_block(in.lp);
      break;
    case SftTask::FormulationToLp:
      user = pick(s, {"Convert the following optimization model into a CPLEX LP file. Put the file in a ```lp block.",
                      "Here is a mathematical model. Write it as a solver-ready LP file (CPLEX LP format) in a ```lp code block.",
                      "Translate this formulation into CPLEX LP format (inside ```lp fences)."}) +
             "\n\n" + in.formulation;
      assistant = lp_block(in.lp);
      break;
    case SftTask::StatementToLpAnswer: {
      const std::string instr = Rng(s).next_u64() % 3 == 0 ? solve_instruction()
                                                           : pick(s + 1, {"Give the model as a CPLEX LP file in a ```lp block, then the optimal objective value.",
                                                                          "Write the LP file (CPLEX LP format, fenced as ```lp) and report the optimal value."});
      user = in.statement + "\n\n" + instr;
      std::string ans;
      if (in.result.status == SolveResult::Optimal)
        ans = "Solving this model gives the optimal " + in.obj_desc + ": " + amount(in, in.result.objective) + ".\nFinal answer: " + label_text(in.result);
      else
        ans = "The solver reports the model " + std::string(status_name(in.result.status)) + (in.reason.empty() ? "" : ": " + in.reason) +
              ".\nFinal answer: " + label_text(in.result);
      assistant = lp_block(in.lp) + "\n" + ans + "\n";
      break;
    }
  }
  nlohmann::ordered_json j;
  j["id"] = "train-" + std::to_string(index);
  j["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", user}}, {{"role", "assistant"}, {"content", assistant}}});
  j["category"] = in.category;
  j["family"] = in.family;
  j["task"] = task_name(task);
  j["template"] = in.tmpl;
  j["answer"] = label_json(in.result);
  return j;
}

nlohmann::ordered_json test_record(const Instance& in, int64_t index) {
  nlohmann::ordered_json j;
  j["id"] = "test-" + std::to_string(index);
  j["question"] = in.statement;
  j["answer"] = label_json(in.result);
  j["category"] = in.category;
  j["family"] = in.family;
  j["template"] = in.tmpl;
  return j;
}

DatasetReport write_dataset(const GenOptions& opts, const std::string& dir) {
  const double t0 = now_ms();
  DatasetReport rep;
  {  // the output folder first: a bad --out fails before minutes of generation
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    TREX_USER_CHECK(!ec, "give --out a folder that can be created and written", "cannot create the output folder ",
                    dir, ": ", ec.message());
  }
  std::vector<Instance> all = generate(opts, rep.gen);
  // Each file written atomically and durably (io/atomic_file.h: a full disk or an unwritable folder
  // is a UserError naming the file and the operation).
  const std::filesystem::path out(dir);
  std::string cpt, sft, test;
  int64_t ntrain = 0, ntest = 0;
  for (const Instance& in : all) {
    if (in.split == "train") {
      const SftTask task = (SftTask)(ntrain % 3);
      cpt += nlohmann::ordered_json{{"text", cpt_document(in)}}.dump() + "\n";
      sft += sft_record(in, task, ntrain).dump() + "\n";
      ++rep.per_task[task_name(task)];
      ++ntrain;
    } else {
      test += test_record(in, ntest++).dump() + "\n";
    }
  }
  io::write_file_atomic((out / "cpt.jsonl").string(), cpt);
  io::write_file_atomic((out / "sft.jsonl").string(), sft);
  io::write_file_atomic((out / "test.jsonl").string(), test);
  rep.n_cpt = rep.n_sft = ntrain;
  rep.n_test = ntest;
  rep.total_seconds = (now_ms() - t0) / 1000.0;
  nlohmann::ordered_json st;
  st["seed"] = opts.seed;
  st["n_train_requested"] = opts.n_train;
  st["n_test_requested"] = opts.n_test;
  st["cpt_documents"] = rep.n_cpt;
  st["sft_samples"] = rep.n_sft;
  st["test_problems"] = rep.n_test;
  st["generated"] = rep.gen.generated;
  st["kept"] = rep.gen.kept;
  st["dedup_drops"] = rep.gen.dup_drops;
  st["intent_mismatch_drops"] = rep.gen.mismatch_drops;
  st["unsolved_drops"] = rep.gen.unsolved_drops;
  st["drops_by_family"] = rep.gen.drops_by_family;
  st["per_category"] = rep.gen.per_category;
  st["per_family"] = rep.gen.per_family;
  st["per_status"] = rep.gen.per_status;
  st["per_template"] = rep.gen.per_template;
  st["per_task"] = rep.per_task;
  st["generate_seconds"] = rep.gen.seconds;
  st["solve_seconds"] = rep.gen.solve_seconds;
  st["total_seconds"] = rep.total_seconds;
  io::write_file_atomic((out / "stats.json").string(), st.dump(2) + "\n");
  return rep;
}

}  // namespace trex::orx
