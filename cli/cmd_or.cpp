// trex or gen   --n N --out DIR --seed S [--test-frac F]: solver-verified OR data (cpt/sft/test.jsonl, stats.json)
// trex or solve FILE [--time-limit S]: solve a CPLEX LP (.lp) or MPS (.mps) file, print one JSON line
// trex or eval  --predictions P.jsonl --data TEST.jsonl [--out RESULTS.jsonl]: judge given outputs (Pass@1)
// See docs/OR.md.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include "cli/commands.h"
#include "core/error.h"
#include "or/dataset.h"
#include "or/judge.h"
#include "or/solver.h"

namespace trex::cli {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TREX_USER_CHECK(f.good(), "check the path", "cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void add_gen(CLI::App& parent) {
  auto* gen = parent.add_subcommand("gen", "generate solver-verified OR data: cpt.jsonl, sft.jsonl, test.jsonl, stats.json");
  struct Opts {
    int64_t n = 1000;
    std::string out;
    uint64_t seed = 1;
    double test_frac = 0.1, time_limit = 10, infeasible = 0.04, unbounded = 0.01;
    std::vector<std::string> families;
  };
  auto o = std::make_shared<Opts>();
  gen->add_option("--n", o->n, "train instances = SFT samples = CPT documents (default 1000)");
  gen->add_option("--out", o->out, "output folder")->required();
  gen->add_option("--seed", o->seed, "random seed (default 1)");
  gen->add_option("--test-frac", o->test_frac, "share of all instances that go to test.jsonl (default 0.1)");
  gen->add_option("--time-limit", o->time_limit, "seconds per solve; instances that hit it are dropped (default 10)");
  gen->add_option("--infeasible-share", o->infeasible, "intended share of infeasible instances (default 0.04)");
  gen->add_option("--unbounded-share", o->unbounded, "intended share of unbounded instances (default 0.01)");
  gen->add_option("--families", o->families, "only these families (default all; names in docs/OR.md)");
  gen->callback([o] {
    TREX_USER_CHECK(o->n >= 0, "give --n >= 0", "--n is negative");
    TREX_USER_CHECK(o->test_frac >= 0 && o->test_frac < 1, "give --test-frac in [0, 1)", "--test-frac out of range: ", o->test_frac);
    orx::GenOptions g;
    g.n_train = o->n;
    g.n_test = (int64_t)std::llround(o->n * o->test_frac / (1 - o->test_frac));
    g.seed = o->seed;
    g.time_limit_s = o->time_limit;
    g.infeasible_share = o->infeasible;
    g.unbounded_share = o->unbounded;
    g.families = o->families;
    orx::DatasetReport r = orx::write_dataset(g, o->out);
    std::printf("{\"out\": \"%s\", \"cpt\": %lld, \"sft\": %lld, \"test\": %lld, \"generated\": %lld, \"dedup_drops\": %lld, "
                "\"mismatch_drops\": %lld, \"unsolved_drops\": %lld, \"solve_seconds\": %.2f, \"total_seconds\": %.2f}\n",
                o->out.c_str(), (long long)r.n_cpt, (long long)r.n_sft, (long long)r.n_test, (long long)r.gen.generated,
                (long long)r.gen.dup_drops, (long long)r.gen.mismatch_drops, (long long)r.gen.unsolved_drops, r.gen.solve_seconds,
                r.total_seconds);
  });
}

void add_solve(CLI::App& parent) {
  auto* solve = parent.add_subcommand("solve", "solve a CPLEX LP or MPS file with CBC/CLP and print the result as JSON");
  struct Opts {
    std::string file;
    double time_limit = 60;
    bool mps = false, values = false;
  };
  auto o = std::make_shared<Opts>();
  solve->add_option("file", o->file, "model file (.lp, or .mps / --mps)")->required();
  solve->add_option("--time-limit", o->time_limit, "seconds (default 60)");
  solve->add_flag("--mps", o->mps, "read MPS even if the name does not end in .mps");
  solve->add_flag("--values", o->values, "include the variable values");
  solve->callback([o] {
    const std::string text = read_text(o->file);
    const bool mps = o->mps || (o->file.size() > 4 && o->file.substr(o->file.size() - 4) == ".mps");
    auto s = orx::make_cbc_solver();
    orx::SolveResult r = mps ? s->solve_mps_text(text, o->time_limit) : s->solve_lp_text(text, o->time_limit);
    nlohmann::ordered_json j;
    j["file"] = o->file;
    j["status"] = orx::status_name(r.status);
    j["objective"] = r.status == orx::SolveResult::Optimal ? nlohmann::ordered_json(r.objective) : nlohmann::ordered_json(nullptr);
    if (!r.message.empty()) j["message"] = r.message;
    if (r.line) j["line"] = r.line;
    j["seconds"] = r.seconds;
    if (o->values) {
      nlohmann::ordered_json v = nlohmann::ordered_json::object();
      for (const auto& [name, x] : r.values) v[name] = x;
      j["values"] = v;
    }
    std::printf("%s\n", j.dump().c_str());
  });
}

void add_eval(CLI::App& parent) {
  auto* ev = parent.add_subcommand("eval", "Pass@1 of model outputs: extract the LP block, solve, compare with the answer");
  struct Opts {
    std::string predictions, data, out, qfield, afield;
    double time_limit = 20;
  };
  auto o = std::make_shared<Opts>();
  ev->add_option("--predictions", o->predictions, "JSONL with the model outputs (field output|prediction|response|completion)")->required();
  ev->add_option("--data", o->data, "JSONL with question/answer (or en_question/en_answer)")->required();
  ev->add_option("--out", o->out, "write one JSON line per problem here");
  ev->add_option("--question-field", o->qfield, "question field name (default: question, en_question, problem, prompt)");
  ev->add_option("--answer-field", o->afield, "answer field name (default: answer, en_answer, ground_truth, label)");
  ev->add_option("--time-limit", o->time_limit, "seconds per solve (default 20)");
  ev->callback([o] {
    orx::EvalOptions eo;
    eo.question_field = o->qfield;
    eo.answer_field = o->afield;
    eo.time_limit_s = o->time_limit;
    std::vector<orx::Problem> probs = orx::load_problems(o->data, eo);
    orx::PredictionsSource src(o->predictions);
    std::ofstream res;
    if (!o->out.empty()) {
      res.open(o->out);
      TREX_USER_CHECK(res.good(), "check that the folder exists and is writable", "cannot write ", o->out);
    }
    orx::EvalSummary s = orx::evaluate(probs, src, eo, o->out.empty() ? nullptr : &res);
    std::fputs(orx::format_summary(s).c_str(), stdout);
    std::printf("%s\n", orx::summary_json(s).dump().c_str());
  });
}

}  // namespace

void add_or(CLI::App& app) {
  auto* ors = app.add_subcommand("or", "Operations Research workflow: data generation, solving, Pass@1 evaluation");
  ors->require_subcommand(1);
  add_gen(*ors);
  add_solve(*ors);
  add_eval(*ors);
}

}  // namespace trex::cli
