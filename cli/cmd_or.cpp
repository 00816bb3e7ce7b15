// trex or gen   --n N --out DIR --seed S [--test-frac F]: solver-verified OR data (cpt/sft/test.jsonl, stats.json)
// trex or solve FILE [--time-limit S]: solve a CPLEX LP (.lp) or MPS (.mps) file, print one JSON line
// trex or eval  (--predictions P.jsonl | --model DIR) --data TEST.jsonl|SET.json [--format NAME] [--out RESULTS.jsonl]:
//               Pass@1 of LP / MPS blocks and of Python solver programs (run in or/sandbox.h)
// See docs/OR.md.
#include <algorithm>
#include <map>
#include <memory>
#include "cli/tokenizer_fns.h"
#include "core/parallel.h"
#include "model/checkpoint.h"
#include "model/generate.h"
#include "train/data.h"
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
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
    if (r.status == orx::SolveResult::TimeLimit)
      j["incumbent"] = r.has_incumbent ? nlohmann::ordered_json(r.incumbent) : nlohmann::ordered_json(nullptr);
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

// Zero-shot generation from a checkpoint: the question wrapped in the evaluation prompt
// (or/dataset.h: eval_prompt) as one user turn of the chat template; greedy, or sampled with
// temperature / top_p, sample j of every problem drawing from Rng(seed + j). batch > 1: the
// problems are generated `batch` at a time (model::generate_batch: the same outputs as one at a
// time), the first request of a group generating the group.
class ModelSource final : public orx::OutputSource {
 public:
  ModelSource(const std::string& dir, const std::string& tokenizer, const std::string& tmpl, int64_t max_tokens,
              const std::vector<orx::Problem>& problems, int64_t batch, const model::SampleParams& sp)
      : cfg_(model::load_config_json(dir + "/config.json")),
        m_(cfg_, kern::Prec::F32),
        tok_(io::Tokenizer::load(tokenizer.empty() ? dir : tokenizer)),
        tmpl_(train::ChatTemplate::by_name(tmpl)),
        max_tokens_(max_tokens),
        problems_(problems),
        batch_(batch),
        sp_(sp) {
    TREX_USER_CHECK(batch >= 1, "use --batch >= 1", "or eval: --batch ", batch, " must be >= 1");
    model::load_hf_weights(m_, dir);
    eos_ = stop_ids(tok_, tmpl_);
  }
  std::string output(const orx::Problem& p, size_t i) override { return samples(p, i, 1).front(); }
  std::vector<std::string> samples(const orx::Problem& p, size_t i, int64_t n) override {
    auto it = done_.find(i);
    if (it == done_.end()) {
      generate_from(i, p, n);
      it = done_.find(i);
    }
    std::vector<std::string> out = std::move(it->second);
    done_.erase(it);
    return out;
  }

 private:
  // Generates n samples of problem i and of the next batch - 1 problems with readable answers
  // (those evaluate() asks for next).
  void generate_from(size_t i, const orx::Problem& p, int64_t n) {
    std::vector<size_t> which = {i};
    for (size_t j = i + 1; j < problems_.size() && (int64_t)which.size() < batch_; ++j)
      if (problems_[j].truth.kind != orx::Truth::Unreadable) which.push_back(j);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int64_t> budgets;
    int64_t longest = 0;
    for (size_t j : which) {
      const orx::Problem& q = j == i ? p : problems_[j];
      prompts.push_back(chat_prompt_ids(tok_, tmpl_, orx::eval_prompt(q.question)));
      // Within max_position_embeddings (a prompt that alone fills it is a UserError naming it).
      bool capped = false;
      budgets.push_back(model::generation_budget(cfg_, (int64_t)prompts.back().size(), max_tokens_, &capped));
      if (capped && !warned_cap_) {
        TREX_LOG_WARN("or eval --model: --max-tokens ", max_tokens_, " runs past max_position_embeddings (",
                      cfg_.max_position_embeddings, ") for some prompts; their generation is capped there");
        warned_cap_ = true;
      }
      longest = std::max(longest, (int64_t)prompts.back().size() + budgets.back());
    }
    model::Decoder dec(m_, longest, (int64_t)which.size());
    for (int64_t s = 0; s < n; ++s) {
      model::SampleParams sp = sp_;
      sp.seed = sp_.seed + (uint64_t)s;
      std::vector<model::GenerateResult> r = model::generate_batch(
          dec, prompts, sp, budgets, [&](const std::vector<int32_t>& t) { return tok_.decode(t, true); }, eos_);
      for (size_t k = 0; k < which.size(); ++k) done_[which[k]].push_back(std::move(r[k].text));
    }
  }

  model::ModelConfig cfg_;
  model::Model m_;
  io::Tokenizer tok_;
  train::ChatTemplate tmpl_;
  int64_t max_tokens_;
  const std::vector<orx::Problem>& problems_;
  int64_t batch_;
  bool warned_cap_ = false;
  std::vector<int32_t> eos_;
  model::SampleParams sp_;
  std::map<size_t, std::vector<std::string>> done_;  // generated, not yet asked for
};

void add_eval(CLI::App& parent) {
  auto* ev = parent.add_subcommand("eval", "Pass@1 of model outputs: extract the LP block, solve, compare with the answer");
  struct Opts {
    std::string predictions, data, out, qfield, afield, model, tokenizer, tmpl = "deepseek", format = "auto", python;
    double code_wall = 60, code_cpu = 30, code_memory_gb = 4;
    double time_limit = 20, temperature = 0, top_p = 1;
    int64_t max_tokens = 512, batch = 1, samples = 1;
    uint64_t seed = 1;
    std::vector<int64_t> ks;
    int threads = 0;
    bool strict_ids = false;
  };
  auto o = std::make_shared<Opts>();
  ev->add_option("--predictions", o->predictions, "JSONL with the model outputs (field output|prediction|response|completion)");
  ev->add_option("--model", o->model, "checkpoint directory: generate the outputs zero-shot (greedy unless --temperature)");
  ev->add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: MODEL/tokenizer.json)");
  ev->add_option("--template", o->tmpl, "chat template for --model: deepseek | deepseek-v2 | chatml");
  ev->add_option("--max-tokens", o->max_tokens, "generation limit per problem for --model (default 512)");
  ev->add_option("--batch", o->batch, "problems generated together for --model (default 1; same outputs)");
  ev->add_option("--threads", o->threads, "threads");
  ev->add_option("--data", o->data, "JSON array or JSONL of problems: trex's test.jsonl or a public set as it ships")->required();
  ev->add_option("--format", o->format,
                 "data layout and answer rule: auto (from the file name, else the fields) | trex | nl4opt | mamo_easylp | "
                 "mamo_complexlp | industryor | optmath | optibench | complexor | orlm (docs/OR.md)");
  ev->add_option("--python", o->python,
                 "interpreter for Python solver-code outputs (default: $TREX_OR_PYTHON, .venv/bin/python, python3)");
  ev->add_option("--code-wall", o->code_wall, "wall-clock seconds per Python program (default 60)");
  ev->add_option("--code-cpu", o->code_cpu, "CPU seconds per Python program (default 30)");
  ev->add_option("--code-memory-gb", o->code_memory_gb, "address-space limit per Python program in GiB (default 4)");
  ev->add_option("--out", o->out, "write one JSON line per problem here");
  ev->add_option("--question-field", o->qfield, "question field name (default: question, en_question, problem, prompt)");
  ev->add_option("--answer-field", o->afield, "answer field name (default: answer, en_answer, ground_truth, label)");
  ev->add_option("--time-limit", o->time_limit, "seconds per solve (default 20)");
  ev->add_option("--samples", o->samples,
                 "outputs judged per problem (default 1); > 1 reports pass@k (unbiased estimator) and the majority "
                 "vote: --predictions lists them (repeated ids or an \"outputs\" list), --model samples them");
  ev->add_option("--k", o->ks, "k values of pass@k with --samples (1 is always reported; each <= --samples)")->delimiter(',');
  ev->add_option("--temperature", o->temperature, "--model: sampling temperature (default 0: greedy)");
  ev->add_option("--top-p", o->top_p, "--model: nucleus sampling share (default 1)");
  ev->add_option("--seed", o->seed, "--model: sample j of every problem draws from seed + j (default 1)");
  ev->add_flag("--strict-ids", o->strict_ids,
               "refuse predictions that do not pair one to one with the problems (default: a warning with the counts)");
  ev->callback([o] {
    orx::EvalOptions eo;
    eo.question_field = o->qfield;
    eo.answer_field = o->afield;
    eo.time_limit_s = o->time_limit;
    eo.samples = o->samples;
    eo.ks = o->ks;
    eo.format = o->format;
    eo.python = o->python;
    TREX_USER_CHECK(o->code_wall > 0 && o->code_cpu > 0 && o->code_memory_gb > 0,
                    "give --code-wall, --code-cpu and --code-memory-gb > 0", "or eval: a sandbox limit is not positive");
    eo.sandbox.wall_s = o->code_wall;
    eo.sandbox.cpu_s = o->code_cpu;
    eo.sandbox.memory_bytes = (int64_t)(o->code_memory_gb * (1ll << 30));
    TREX_USER_CHECK(o->samples >= 1, "use --samples >= 1", "or eval: --samples ", o->samples);
    TREX_USER_CHECK(o->model.empty() || o->samples == 1 || o->temperature > 0,
                    "give --temperature > 0 to sample, or --samples 1",
                    "or eval --model: --samples ", o->samples, " with greedy decoding gives the same output every time");
    std::vector<orx::Problem> probs = orx::load_problems(o->data, eo);
    TREX_USER_CHECK(o->predictions.empty() != o->model.empty(), "give exactly one of --predictions and --model",
                    "trex or eval: need --predictions FILE or --model DIR");
    init_threads(o->threads);
    std::unique_ptr<orx::OutputSource> src_ptr;
    orx::PredictionsSource* preds = nullptr;
    if (!o->model.empty()) {
      model::SampleParams sp;
      sp.temperature = (float)o->temperature, sp.top_p = (float)o->top_p, sp.seed = o->seed;
      src_ptr = std::make_unique<ModelSource>(o->model, o->tokenizer, o->tmpl, o->max_tokens, probs, o->batch, sp);
    }
    else {
      auto ps = std::make_unique<orx::PredictionsSource>(o->predictions);
      const orx::PredictionsSource::Match mt = ps->match(probs, o->samples > 1);
      TREX_USER_CHECK(mt.ok() || !o->strict_ids,
                      "give one prediction per problem, with the problems' ids (or none, in the data's line order), "
                      "or drop --strict-ids to score the rest",
                      o->predictions, " vs ", o->data, ": ", mt.str());
      if (!mt.ok()) TREX_LOG_WARN(o->predictions, " vs ", o->data, ": ", mt.str());
      preds = ps.get();
      src_ptr = std::move(ps);
    }
    orx::OutputSource& src = *src_ptr;
    std::ofstream res;
    if (!o->out.empty()) {
      res.open(o->out);
      TREX_USER_CHECK(res.good(), "check that the folder exists and is writable", "cannot write ", o->out);
    }
    orx::EvalSummary s = orx::evaluate(probs, src, eo, o->out.empty() ? nullptr : &res);
    if (preds && preds->short_samples())
      TREX_LOG_WARN(o->predictions, ": ", preds->short_samples(), " problems have fewer than --samples ", o->samples,
                    " outputs; the missing ones were judged as failed");
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
