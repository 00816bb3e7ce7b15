#include "or/formats.h"
#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include "core/error.h"

namespace trex::orx {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}

// ORLM (eval/execute.py) and OptMATH (eval/executor.py): lenient is their rule, both rounded to
// integers then relative 5% (absolute 0.05 at 0); strict is the relative 1e-6 later papers report.
MatchRule orlm_rule(const char* name = "orlm") {
  MatchRule r;
  r.name = name;
  r.plus_one = false;
  r.strict_rel = 1e-6, r.strict_abs = 1e-6;
  r.round = true;  // lenient only (see rule_match)
  r.lenient_rel = 0.05, r.lenient_abs = 0.05;
  return r;
}
// OptiBench (ReSocratic's eval scripts): strict is theirs, |p - t| < 1e-4 absolute (they check
// every reported value; trex the objective); lenient is trex's relative 5%.
MatchRule optibench_rule() {
  MatchRule r;
  r.name = "abs1e-4";
  r.plus_one = false;
  r.strict_absolute = true;
  r.strict_abs = 1e-4;
  r.lenient_rel = 0.05, r.lenient_abs = 0.05;
  return r;
}
// ComplexOR (Chain-of-Experts' test_generated_code.py): strict is theirs, the output equal to the
// expected one (Python ==, no tolerance); lenient is trex's relative 5%.
MatchRule exact_rule() {
  MatchRule r;
  r.name = "exact";
  r.plus_one = false;
  r.strict_rel = 0, r.strict_abs = 0;
  r.lenient_rel = 0.05, r.lenient_abs = 0.05;
  return r;
}

}  // namespace

const std::vector<DataFormat>& data_formats() {
  static const std::vector<DataFormat> v = [] {
    std::vector<DataFormat> f;
    const std::vector<std::string> q = {"question", "en_question", "problem", "prompt"};
    const std::vector<std::string> a = {"answer", "en_answer", "ground_truth", "label"};
    f.push_back({"trex", q, a, MatchRule{}});
    const std::vector<std::string> eq = {"en_question", "question"}, ea = {"en_answer", "answer"};
    for (const char* n : {"orlm", "nl4opt", "mamo_easylp", "mamo_complexlp", "industryor"}) f.push_back({n, eq, ea, orlm_rule()});
    f.push_back({"optmath", eq, ea, orlm_rule("optmath")});
    f.push_back({"optibench", eq, ea, optibench_rule()});
    f.push_back({"complexor", eq, ea, exact_rule()});
    return f;
  }();
  return v;
}

const DataFormat& format_by_name(const std::string& name) {
  const std::string n = lower(name);
  std::string names;
  for (const DataFormat& f : data_formats()) {
    if (f.name == n) return f;
    names += (names.empty() ? "" : ", ") + f.name;
  }
  TREX_USER_FAIL("use one of: auto, " + names, "--format ", name, " is not a known data layout");
}

std::string format_from_name(const std::string& text) {
  std::string t;
  for (char c : lower(text))
    if (std::isalnum((unsigned char)c)) t += c;
  static const std::pair<const char*, const char*> keys[] = {
      {"nl4opt", "nl4opt"},         {"easylp", "mamo_easylp"},   {"complexlp", "mamo_complexlp"},
      {"industryor", "industryor"}, {"optmath", "optmath"},      {"optibench", "optibench"},
      {"complexor", "complexor"}};
  for (const auto& [k, n] : keys)
    if (t.find(k) != std::string::npos) return n;
  return "";
}

const DataFormat& detect_format(const std::string& requested, const std::string& path, const nlohmann::json& first) {
  if (!requested.empty() && requested != "auto") return format_by_name(requested);
  const size_t slash = path.find_last_of('/');
  const std::string by_file = format_from_name(slash == std::string::npos ? path : path.substr(slash + 1));
  if (!by_file.empty()) return format_by_name(by_file);
  if (first.is_object() && first.contains("en_question")) return format_by_name("orlm");
  return format_by_name("trex");
}

std::vector<std::pair<nlohmann::json, int64_t>> read_records(const std::string& path, bool* array) {
  if (array) *array = false;
  std::ifstream f(path, std::ios::binary);
  TREX_USER_CHECK(f.good(), "give an existing JSON or JSONL file with --data", "cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::vector<std::pair<nlohmann::json, int64_t>> out;
  const size_t b = text.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return out;
  // A whole-file JSON value: an array of records, or an object holding one array of records.
  nlohmann::json whole = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!whole.is_discarded()) {
    if (whole.is_object()) {
      const nlohmann::json* arr = nullptr;
      for (auto it = whole.begin(); it != whole.end(); ++it)
        if (it->is_array() && !it->empty() && (*it)[0].is_object()) arr = &*it;
      if (arr) whole = *arr;
    }
    if (whole.is_array()) {
      if (array) *array = true;
      for (size_t i = 0; i < whole.size(); ++i) {
        TREX_USER_CHECK(whole[i].is_object(), "give an array of JSON objects", path, ": element ", i, " is a ",
                        whole[i].type_name(), ", not an object");
        out.emplace_back(whole[i], (int64_t)i + 1);
      }
      return out;
    }
    if (whole.is_object()) {  // one record (a one-line JSONL file)
      out.emplace_back(whole, 1);
      return out;
    }
  }
  TREX_USER_CHECK(text[b] != '[', "fix the JSON array (or give JSONL: one object per line)", path,
                  ": starts with '[' but is not valid JSON");
  std::istringstream in(text);
  std::string line;
  int64_t ln = 0;
  while (std::getline(in, line)) {
    ++ln;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      TREX_USER_FAIL("each line must be one JSON object (or give one JSON array)", path, ":", ln, ": invalid JSON (",
                     e.what(), ")");
    }
    TREX_USER_CHECK(j.is_object(), "each line must be one JSON object", path, ":", ln, ": a ", j.type_name());
    out.emplace_back(std::move(j), ln);
  }
  return out;
}

}  // namespace trex::orx
