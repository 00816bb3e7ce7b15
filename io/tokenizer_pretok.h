// Pre-tokenizer of a byte-level BPE tokenizer.json: an optional chain of Split steps
// (regex or string pattern, any SplitDelimiterBehavior, invert), Digits steps, then ByteLevel
// (optional prefix space, optional GPT-2 regex). Produces the raw-byte pieces that BPE encodes;
// the ByteLevel byte->character mapping itself is implicit (BPE works on byte ids).
#pragma once
#include <deque>
#include <string>
#include <string_view>
#include <vector>
#include <nlohmann/json.hpp>

#include "io/tokenizer_regex.h"

namespace trex::io::tok {

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitStep {
  PreRegex re;
  SplitBehavior behavior;
  bool invert;
};

struct SplitPart {
  uint32_t b, e;
  bool m;  // a match of the pattern (after invert)
};

// Scratch reused across calls by one thread.
struct PretokScratch {
  MatchData md;
  std::vector<Span> matches, a, b, acc;
  std::vector<SplitPart> parts;
  std::deque<std::string> aux;  // pieces that got a prefix space
};

class PreTokenizer {
 public:
  // j: the "pre_tokenizer" value. `where` names the file for messages. Throws UserError naming
  // the field and what is supported.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& where);

  // The DeepSeek-V3 pre_tokenizer (three Isolated Splits then ByteLevel without regex), as JSON.
  static nlohmann::ordered_json deepseek_v3_json();

  // text: valid UTF-8 (no added tokens). Appends the final pieces (raw bytes) to `out`; they
  // point into `text` or into s.aux, valid until the next call with the same scratch.
  void run(std::string_view text, PretokScratch& s, std::vector<std::string_view>& out) const;

 private:
  void split(const SplitStep& st, std::string_view piece, PretokScratch& s, std::vector<Span>& out,
             uint32_t base) const;
  std::vector<SplitStep> steps_;
  bool add_prefix_space_ = false;
  std::vector<SplitStep> byte_level_split_;  // empty, or the GPT-2 pattern (use_regex: true)
};

// Reads a JSON value of the expected type or throws UserError "<where>: field <path> ...".
namespace json_get {
bool boolean(const nlohmann::json& j, const char* key, bool dflt, const std::string& where, const std::string& path);
const std::string& string(const nlohmann::json& j, const char* key, const std::string& where, const std::string& path);
}  // namespace json_get

}  // namespace trex::io::tok
