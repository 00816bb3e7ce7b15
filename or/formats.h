// Public OR benchmark layouts read as they ship (docs/OR.md "Public benchmarks" says where each
// convention comes from): which fields hold the question, the answer, the id and a per-set label,
// and each set's answer rule (or/judge.h MatchRule).
//   trex            question / answer (trex or gen's test.jsonl); strict |p-t|/(|t|+1) < 1e-6, lenient 5%
//   nl4opt, mamo_easylp, mamo_complexlp, industryor (the ORLM releases)
//                   en_question / en_answer; "No Best Solution" = infeasible; strict relative 1e-6;
//                   lenient: both rounded to integers, relative 5% (absolute 5% of 1 at truth 0)
//   optmath         en_question|question / en_answer|answer; OptMATH's own rule is ORLM's lenient one
//                   (rounded, 5%); strict relative 1e-6
//   optibench       en_question|question / en_answer|answer; strict |p - t| < 1e-4 (the authors'),
//                   lenient relative 5%
//   complexor       en_question|question / en_answer|answer; strict exact equality (the authors'),
//                   lenient relative 5%
// Detection: the file name (nl4opt, easylp, complexlp, industryor, optmath, optibench, complexor,
// case-insensitive), else the fields (en_question -> the ORLM rule, under the name "orlm"), else trex.
// A record with a "benchmark" or "dataset" string naming a set is judged with that set's rule and
// counted under its name (files that mix several sets).
#pragma once
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "or/judge.h"

namespace trex::orx {

struct DataFormat {
  std::string name;
  std::vector<std::string> question_fields, answer_fields;
  MatchRule rule;
};

const std::vector<DataFormat>& data_formats();
// By name; a UserError listing the names when unknown.
const DataFormat& format_by_name(const std::string& name);
// From a set name or a file name ("" when nothing matches).
std::string format_from_name(const std::string& text);
// `requested` "" / "auto": from the file name, else the first record's fields.
const DataFormat& detect_format(const std::string& requested, const std::string& path, const nlohmann::json& first);

// The records of a data file: a JSON array (or an object with one array-valued field), or JSONL.
// Each record paired with its 1-based line (JSONL) or index (array; *array set) for messages.
std::vector<std::pair<nlohmann::json, int64_t>> read_records(const std::string& path, bool* array = nullptr);

}  // namespace trex::orx
