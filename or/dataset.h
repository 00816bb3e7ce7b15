// The OR data factory's files (written by `trex or gen`):
//   cpt.jsonl   {"text"}: one explanatory document per train instance (problem, formulation,
//               LP file, solver-verified solution and what it means)
//   sft.jsonl   {"id","messages":[user, assistant],"category","family","task","template","answer"}
//               tasks: statement_to_formulation_lp | formulation_to_lp | statement_to_lp_answer
//   test.jsonl  {"id","question","answer" (number | "infeasible" | "unbounded"),"category","family","template"}
//   stats.json  counts per category / family / status / template / task, drops, timings
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <nlohmann/json.hpp>
#include "or/generator.h"

namespace trex::orx {

enum class SftTask { StatementToFormulationLp, FormulationToLp, StatementToLpAnswer };
const char* task_name(SftTask t);

// The instruction that follows a question at evaluation time (also one of the SFT phrasings).
const std::string& solve_instruction();
// question + blank line + solve_instruction().
std::string eval_prompt(const std::string& question);

std::string cpt_document(const Instance& in);
nlohmann::ordered_json sft_record(const Instance& in, SftTask task, int64_t index);
nlohmann::ordered_json test_record(const Instance& in, int64_t index);
// The label as JSON: a number, or the string "infeasible" / "unbounded".
nlohmann::ordered_json label_json(const SolveResult& r);

struct DatasetReport {
  GenStats gen;
  int64_t n_cpt = 0, n_sft = 0, n_test = 0;
  std::map<std::string, int64_t> per_task;
  double total_seconds = 0;
};

// Generates (opts) and writes the four files into `dir` (created if missing).
DatasetReport write_dataset(const GenOptions& opts, const std::string& dir);

}  // namespace trex::orx
