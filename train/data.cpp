#include "train/data.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"

namespace trex::train {

using nlohmann::json;

ChatTemplate ChatTemplate::by_name(const std::string& name) {
  ChatTemplate t;
  if (name == "deepseek") return t;
  if (name == "chatml") {
    t.name = "chatml";
    t.bos = "";
    t.eos = "<|im_end|>";
    t.user = "<|im_start|>user\n";
    t.assistant = "<|im_start|>assistant\n";
    return t;
  }
  if (name == "deepseek-v2") {  // tokenizer_config.json chat_template of DeepSeek-V2-Chat / V2.5
    t.name = "deepseek-v2";
    t.user = "User: ";
    t.assistant = "Assistant:";
    return t;
  }
  TREX_USER_FAIL("allowed: deepseek, deepseek-v2, chatml", "data.chat_template '", name, "' is not a known template");
}

bool parse_sft_line(std::string_view line, const std::string& where, std::vector<Message>* out, DataStats& st) {
  out->clear();
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    st.error(where + ": not valid JSON (" + std::string(e.what()).substr(0, 120) + ")");
    return false;
  }
  if (!j.is_object()) {
    st.error(where + ": a sample must be a JSON object");
    return false;
  }
  if (j.contains("messages")) {
    const json& ms = j["messages"];
    if (!ms.is_array() || ms.empty()) {
      st.error(where + ": 'messages' must be a non-empty list");
      return false;
    }
    for (size_t i = 0; i < ms.size(); ++i) {
      const json& m = ms[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
          !m["content"].is_string()) {
        st.error(where + ": messages[" + std::to_string(i) + "] needs string 'role' and 'content'");
        return false;
      }
      std::string role = m["role"];
      if (role != "system" && role != "user" && role != "assistant") {
        st.error(where + ": messages[" + std::to_string(i) + "].role '" + role +
                 "' is not system, user or assistant");
        return false;
      }
      out->push_back({role, m["content"]});
    }
    return true;
  }
  if (j.contains("instruction") && j.contains("output")) {
    if (!j["instruction"].is_string() || !j["output"].is_string() ||
        (j.contains("input") && !j["input"].is_null() && !j["input"].is_string())) {
      st.error(where + ": alpaca fields 'instruction', 'input', 'output' must be strings");
      return false;
    }
    std::string user = j["instruction"];
    if (j.contains("input") && j["input"].is_string() && !j["input"].get<std::string>().empty())
      user += "\n\n" + j["input"].get<std::string>();
    out->push_back({"user", user});
    out->push_back({"assistant", j["output"]});
    return true;
  }
  st.error(where + ": expected {\"messages\": [...]} or {\"instruction\", \"input\", \"output\"}");
  return false;
}

Sample render_chat(const std::vector<Message>& msgs, const ChatTemplate& t, const EncodeFn& encode,
                   bool train_on_prompt) {
  Sample s;
  auto add = [&](std::string_view text, bool target) {
    if (text.empty()) return;
    for (int32_t id : encode(text)) {
      s.ids.push_back(id);
      s.loss.push_back(target ? 1 : 0);
    }
  };
  add(t.bos, false);
  if (t.name == "deepseek-v2") {
    // Plain-text turns, each encoded whole as the tokenizer sees the rendered chat: "{system}\n\n",
    // "User: {user}\n\n", then "Assistant:" (context, the generation prompt) and " {reply}" + EOS
    // (targets: what the model writes after the prompt, leading space included).
    for (const Message& m : msgs) {
      if (m.role == "system") {
        add(m.content + "\n\n", train_on_prompt);
      } else if (m.role == "user") {
        add(t.user + m.content + "\n\n", train_on_prompt);
      } else {
        add(t.assistant, train_on_prompt);
        add(" " + m.content, true);
        add(t.eos, true);
      }
    }
    if (!s.loss.empty()) s.loss[0] = 0;
    return s;
  }
  for (const Message& m : msgs) {
    if (m.role == "system") {
      if (t.name == "chatml") add("<|im_start|>system\n" + m.content + t.eos + "\n", train_on_prompt);
      else add(m.content, train_on_prompt);
    } else if (m.role == "user") {
      add(t.user, train_on_prompt);
      add(m.content, train_on_prompt);
      if (t.name == "chatml") add(t.eos + "\n", train_on_prompt);
    } else {
      add(t.assistant, train_on_prompt);
      add(m.content, true);
      add(t.eos, true);
      if (t.name == "chatml") add("\n", train_on_prompt);
    }
  }
  if (!s.loss.empty()) s.loss[0] = 0;  // the first token is never predicted
  return s;
}

std::vector<int32_t> render_generation_prompt(const std::vector<Message>& msgs, const ChatTemplate& t,
                                              const EncodeFn& encode) {
  std::vector<int32_t> ids = render_chat(msgs, t, encode, false).ids;
  std::vector<int32_t> head = encode(t.assistant);
  ids.insert(ids.end(), head.begin(), head.end());
  return ids;
}

Sample cpt_document(std::string_view text, const EncodeFn& encode, int32_t eos_id) {
  Sample s;
  s.ids = encode(text);
  s.ids.push_back(eos_id);
  s.loss.assign(s.ids.size(), 1);
  s.loss[0] = 0;
  return s;
}

namespace {

std::ifstream open_data(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TREX_USER_CHECK(f.good(), "check data.files / data.train paths", path, ": cannot open data file");
  return f;
}

bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::char_traits<char>::length(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

void count(const Sample& s, DataStats& st) {
  ++st.samples;
  st.tokens += s.ids.size();
  for (uint8_t l : s.loss) st.target_tokens += l;
}

}  // namespace

std::vector<Sample> read_cpt_file(const std::string& path, const EncodeFn& encode, int32_t eos_id, DataStats& st) {
  std::ifstream f = open_data(path);
  std::vector<Sample> docs;
  if (ends_with(path, ".jsonl")) {
    std::string line;
    int64_t ln = 0;
    while (std::getline(f, line)) {
      ++ln;
      ++st.lines;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception&) {
        st.error(path + ":" + std::to_string(ln) + ": not valid JSON");
        continue;
      }
      if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
        st.error(path + ":" + std::to_string(ln) + ": expected {\"text\": \"...\"}");
        continue;
      }
      docs.push_back(cpt_document(j["text"].get<std::string>(), encode, eos_id));
      count(docs.back(), st);
    }
  } else {
    // Plain text: one document per block of lines, blocks separated by blank (or whitespace-only)
    // lines; the lines of a block keep their newlines between them.
    std::string line, block;
    auto flush = [&] {
      if (!block.empty()) {
        docs.push_back(cpt_document(block, encode, eos_id));
        count(docs.back(), st);
      }
      block.clear();
    };
    while (std::getline(f, line)) {
      ++st.lines;
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        flush();
        continue;
      }
      if (!block.empty()) block += '\n';
      block += line;
    }
    flush();
  }
  TREX_USER_CHECK(!docs.empty(), "give a file with at least one document", path,
                  ": no usable documents (", st.skipped_malformed, " malformed lines)");
  return docs;
}

std::vector<Sample> read_sft_file(const std::string& path, const ChatTemplate& t, const EncodeFn& encode,
                                  bool train_on_prompt, DataStats& st) {
  std::ifstream f = open_data(path);
  std::vector<Sample> out;
  std::vector<Message> msgs;
  std::string line;
  int64_t ln = 0;
  while (std::getline(f, line)) {
    ++ln;
    ++st.lines;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!parse_sft_line(line, path + ":" + std::to_string(ln), &msgs, st)) continue;
    Sample s = render_chat(msgs, t, encode, train_on_prompt);
    bool any = false;
    for (uint8_t l : s.loss) any |= l != 0;
    if (!any) {  // e.g. only prompt tokens: nothing to learn from
      ++st.skipped_no_target;
      continue;
    }
    count(s, st);
    out.push_back(std::move(s));
  }
  TREX_USER_CHECK(!out.empty(), "give a JSONL file with chat or alpaca samples", path, ": no usable samples (",
                  st.skipped_malformed, " malformed, ", st.skipped_no_target, " without assistant tokens)");
  return out;
}

std::vector<PackedSeq> pack(const std::vector<Sample>& docs, int64_t seq_len, OverflowPolicy policy, bool split_long,
                            int32_t pad_id, DataStats& st) {
  std::vector<DocSpan> spans;
  spans.reserve(docs.size());
  for (const Sample& d : docs) spans.push_back({d.ids.data(), d.loss.data(), (int64_t)d.ids.size()});
  return pack(spans, seq_len, policy, split_long, pad_id, st);
}

std::vector<PackedSeq> pack(const std::vector<DocSpan>& docs, int64_t seq_len, OverflowPolicy policy, bool split_long,
                            int32_t pad_id, DataStats& st) {
  TREX_USER_CHECK(seq_len >= 2, "set seq_len >= 2", "seq_len ", seq_len, " is too short");
  std::vector<PackedSeq> out;
  PackedSeq cur;
  int32_t seg = 0;
  auto flush = [&] {
    if (cur.ids.empty()) return;
    while ((int64_t)cur.ids.size() < seq_len) {  // pad: no loss, own segment
      cur.ids.push_back(pad_id);
      cur.targets.push_back(-100);
      cur.pos.push_back(0);
      cur.seg.push_back(-1);
    }
    out.push_back(std::move(cur));
    cur = PackedSeq{};
    seg = 0;
  };
  auto place = [&](const int32_t* ids, const uint8_t* loss, int64_t n) {
    if ((int64_t)cur.ids.size() + n > seq_len) flush();
    for (int64_t i = 0; i < n; ++i) {
      cur.ids.push_back(ids[i]);
      cur.targets.push_back(i + 1 < n && loss[i + 1] ? ids[i + 1] : -100);
      cur.pos.push_back((int32_t)i);
      cur.seg.push_back(seg);
    }
    ++seg;
  };
  for (const DocSpan& d : docs) {
    const int64_t n = d.n;
    if (n == 0) continue;
    if (n <= seq_len) {
      place(d.ids, d.loss, n);
    } else if (split_long) {
      for (int64_t o = 0; o < n; o += seq_len) place(d.ids + o, d.loss + o, std::min(seq_len, n - o));
    } else if (policy == OverflowPolicy::Truncate) {
      bool any = false;  // a truncation that cuts off every target leaves nothing to learn
      for (int64_t i = 1; i < seq_len; ++i) any |= d.loss[i] != 0;
      if (!any) {
        ++st.dropped_too_long;
        continue;
      }
      ++st.truncated;
      place(d.ids, d.loss, seq_len);
    } else {
      ++st.dropped_too_long;
    }
  }
  flush();
  return out;
}

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> o(n);
  for (int64_t i = 0; i < n; ++i) o[i] = i;
  Rng r(seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch + 1);
  for (int64_t i = n - 1; i > 0; --i) std::swap(o[i], o[r.next_u64() % (uint64_t)(i + 1)]);
  return o;
}

BatchBuffer make_batch(const std::vector<PackedSeq>& seqs, const std::vector<int64_t>& which) {
  BatchBuffer b;
  for (int64_t i : which) {
    const PackedSeq& s = seqs.at(i);
    b.ids.insert(b.ids.end(), s.ids.begin(), s.ids.end());
    b.targets.insert(b.targets.end(), s.targets.begin(), s.targets.end());
    b.pos.insert(b.pos.end(), s.pos.begin(), s.pos.end());
    b.seg.insert(b.seg.end(), s.seg.begin(), s.seg.end());
  }
  return b;
}

}  // namespace trex::train
