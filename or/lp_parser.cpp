#include "or/lp_parser.h"
#include <cctype>
#include <cstdlib>
#include <map>
#include <unordered_set>

namespace trex::orx {

namespace {

enum class Tk { Name, Number, Plus, Minus, Star, Sense, Colon, Bracket, End };

struct Token {
  Tk kind;
  std::string text;
  double value = 0;   // Number
  int sense = 0;      // Sense: -1 (<=), 0 (=), +1 (>=)
  int line = 0;
  bool line_start = false;  // first token on its line
};

struct ParseFail {
  std::string msg;
  int line;
};

bool name_start(char c) { return std::isalpha((unsigned char)c) || c == '_'; }
bool name_char(char c) {
  if (std::isalnum((unsigned char)c)) return true;
  switch (c) {
    case '_': case '.': case '[': case ']': case '{': case '}': case '#': case '$': case '%':
    case '&': case '@': case '!': case '?': case '\'': case '~': case '|': return true;
    default: return false;
  }
}

std::string lower(std::string s) {
  for (auto& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}

std::vector<Token> lex(const std::string& s) {
  std::vector<Token> out;
  int line = 1;
  bool at_start = true;
  size_t i = 0, n = s.size();
  auto push = [&](Tk k, std::string t) {
    out.push_back({k, std::move(t), 0, 0, line, at_start});
    at_start = false;
  };
  while (i < n) {
    char c = s[i];
    if (c == '\n') {
      ++line;
      at_start = true;
      ++i;
    } else if (std::isspace((unsigned char)c)) {
      ++i;
    } else if (c == '\\') {
      if (i + 1 < n && s[i + 1] == '*') {  // \* block comment *\ (may span lines)
        size_t e = s.find("*\\", i + 2);
        if (e == std::string::npos) throw ParseFail{"unterminated \\* comment", line};
        for (size_t k = i; k < e; ++k) line += s[k] == '\n';
        i = e + 2;
      } else {
        while (i < n && s[i] != '\n') ++i;
      }
    } else if (std::isdigit((unsigned char)c) || (c == '.' && i + 1 < n && std::isdigit((unsigned char)s[i + 1]))) {
      size_t b = i;
      while (i < n && (std::isdigit((unsigned char)s[i]) || s[i] == '.')) ++i;
      if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t k = i + 1;
        if (k < n && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < n && std::isdigit((unsigned char)s[k])) {
          i = k;
          while (i < n && std::isdigit((unsigned char)s[i])) ++i;
        }
      }
      std::string t = s.substr(b, i - b);
      if (t.find('.') != t.rfind('.')) throw ParseFail{"malformed number '" + t + "'", line};
      push(Tk::Number, t);
      out.back().value = std::strtod(t.c_str(), nullptr);
    } else if (name_start(c)) {
      size_t b = i;
      while (i < n && name_char(s[i])) ++i;
      if (i - b > 255) throw ParseFail{"name longer than 255 characters", line};
      push(Tk::Name, s.substr(b, i - b));
    } else if (c == '<' || c == '>' || c == '=') {
      size_t b = i++;
      if (i < n && (s[i] == '=' || ((c == '=') && (s[i] == '<' || s[i] == '>')))) ++i;
      std::string t = s.substr(b, i - b);
      push(Tk::Sense, t);
      out.back().sense = t.find('<') != std::string::npos ? -1 : t.find('>') != std::string::npos ? 1 : 0;
    } else if (c == '+') { push(Tk::Plus, "+"); ++i; }
    else if (c == '-') { push(Tk::Minus, "-"); ++i; }
    else if (c == '*') { push(Tk::Star, "*"); ++i; }
    else if (c == ':') { push(Tk::Colon, ":"); ++i; }
    else if (c == '[' || c == ']' || c == '^') { push(Tk::Bracket, std::string(1, c)); ++i; }
    else {
      std::string shown = std::isprint((unsigned char)c) ? std::string(1, c) : "\\x" + std::to_string((unsigned char)c);
      throw ParseFail{"unexpected character '" + shown + "'", line};
    }
  }
  out.push_back({Tk::End, "end of input", 0, 0, line, true});
  return out;
}

enum class Sec { None, Objective, Constraints, Bounds, General, Binary, End, Unsupported };

class Parser {
 public:
  explicit Parser(std::vector<Token> t) : t_(std::move(t)) {}

  LpModel run() {
    Sec s = section_at(p_);
    if (s != Sec::Objective) fail("expected Maximize or Minimize at the start of the LP", cur());
    m_.maximize = lower(cur().text).substr(0, 3) == "max";
    ++p_;
    if (cur().kind == Tk::Colon) ++p_;
    s = objective();
    while (s != Sec::End) {
      if (s == Sec::None) {
        if (cur().kind == Tk::End) break;  // a missing End is accepted
        fail("expected a section keyword (Subject To, Bounds, General, Binary, End), got '" + cur().text + "'", cur());
      }
      if (s == Sec::Unsupported) fail("section '" + cur().text + "' (SOS / semi-continuous) is not supported", cur());
      if (s == Sec::Objective) fail("second objective section '" + cur().text + "'", cur());
      skip_section_keyword(s);
      switch (s) {
        case Sec::Constraints: s = constraints(); break;
        case Sec::Bounds: s = bounds(); break;
        case Sec::General: s = integers(false); break;
        case Sec::Binary: s = integers(true); break;
        default: break;
      }
    }
    return std::move(m_);
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  LpModel m_;
  std::unordered_set<std::string> row_names_;
  const Token* inf_const_ = nullptr;  // first infinite constant term of the last expression

  const Token& cur() const { return t_[p_]; }
  const Token& at(size_t k) const { return t_[std::min(k, t_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& msg, const Token& tok) { throw ParseFail{msg, tok.line}; }

  // Section that starts at token k (keywords count only as the first token of a line).
  Sec section_at(size_t k) const {
    const Token& tk = at(k);
    if (tk.kind == Tk::End) return Sec::None;
    if (tk.kind != Tk::Name || !tk.line_start) return Sec::None;
    const std::string w = lower(tk.text);
    if (w == "maximize" || w == "maximise" || w == "maximum" || w == "max" || w == "minimize" || w == "minimise" ||
        w == "minimum" || w == "min")
      return Sec::Objective;
    if (w == "st" || w == "s.t." || w == "st." || w == "s.t") return Sec::Constraints;
    if ((w == "subject" || w == "such") && at(k + 1).kind == Tk::Name && at(k + 1).line == tk.line) {
      const std::string w2 = lower(at(k + 1).text);
      if ((w == "subject" && w2 == "to") || (w == "such" && w2 == "that")) return Sec::Constraints;
    }
    if (w == "bounds" || w == "bound") return Sec::Bounds;
    if (w == "general" || w == "generals" || w == "gen" || w == "integer" || w == "integers" || w == "int")
      return Sec::General;
    if (w == "binary" || w == "binaries" || w == "bin") return Sec::Binary;
    if (w == "end") return Sec::End;
    if (w == "sos" || w == "semi" || w == "semis" || w == "semi-continuous" || w == "sos1" || w == "sos2")
      return Sec::Unsupported;
    return Sec::None;
  }
  void skip_section_keyword(Sec s) {
    const std::string w = lower(cur().text);
    ++p_;
    if (s == Sec::Constraints && (w == "subject" || w == "such")) ++p_;
    if (cur().kind == Tk::Colon) ++p_;
  }

  bool is_label(size_t k) const { return at(k).kind == Tk::Name && at(k + 1).kind == Tk::Colon; }
  bool is_inf_word(const Token& tk) const {
    if (tk.kind != Tk::Name) return false;
    const std::string w = lower(tk.text);
    return w == "inf" || w == "infinity";
  }

  // A linear expression with constants: terms separated by + / -. Stops before a section
  // keyword, a sense, a label or anything that is not an operator-led term.
  // Returns whether any variable term was read.
  bool expression(std::map<int, double>& coefs, std::vector<int>& order, double& constant) {
    bool any_var = false, first = true;
    inf_const_ = nullptr;
    for (;;) {
      if (section_at(p_) != Sec::None) break;
      double sign = 1;
      bool had_op = false;
      while (cur().kind == Tk::Plus || cur().kind == Tk::Minus) {
        if (cur().kind == Tk::Minus) sign = -sign;
        had_op = true;
        ++p_;
      }
      if (!first && !had_op) break;
      const Token& tk = cur();
      if (tk.kind == Tk::Bracket) fail("quadratic terms ('[' or '^') are not supported", tk);
      if (tk.kind == Tk::Number || is_inf_word(tk)) {
        double v = tk.kind == Tk::Number ? tk.value : kLpInf;
        ++p_;
        bool star = false;
        if (cur().kind == Tk::Star) { star = true; ++p_; }
        if (cur().kind == Tk::Name && !is_label(p_) && section_at(p_) == Sec::None && !is_inf_word(cur())) {
          if (lp_is_inf(v)) fail("coefficient " + tk.text + " is too large", tk);
          add(coefs, order, cur(), sign * v);
          any_var = true;
          ++p_;
          if (cur().kind == Tk::Bracket) fail("quadratic terms ('[' or '^') are not supported", cur());
        } else if (star) {
          fail("expected a variable after '*', got '" + cur().text + "'", cur());
        } else {
          // Infinite constants are clamped to +-kLpInf (so no inf - inf = NaN) and remembered:
          // only a range's leading constant may be infinite (see no_inf_const).
          if (lp_is_inf(v) && !inf_const_) inf_const_ = &tk;
          constant += sign * clamp_inf(v);
        }
      } else if (tk.kind == Tk::Name && !is_label(p_)) {
        add(coefs, order, tk, sign);
        any_var = true;
        ++p_;
        if (cur().kind == Tk::Bracket) fail("quadratic terms ('[' or '^') are not supported", cur());
        if (cur().kind == Tk::Star) fail("a coefficient must come before its variable ('3 x', not 'x * 3')", cur());
      } else if (had_op) {
        fail("expected a number or a variable after '" + std::string(sign < 0 ? "-" : "+") + "', got '" + tk.text + "'", tk);
      } else {
        break;  // empty expression
      }
      first = false;
    }
    return any_var;
  }
  void add(std::map<int, double>& coefs, std::vector<int>& order, const Token& name, double c) {
    const int j = m_.var(name.text);
    auto [it, fresh] = coefs.emplace(j, 0.0);
    if (fresh) order.push_back(j);
    it->second += c;
  }
  static std::vector<LpTerm> terms_of(const std::map<int, double>& coefs, const std::vector<int>& order) {
    std::vector<LpTerm> t;
    for (int j : order) t.push_back({j, coefs.at(j)});
    return t;
  }

  Sec objective() {
    if (is_label(p_) && section_at(p_) == Sec::None) {
      m_.obj_name = cur().text;
      p_ += 2;
    }
    std::map<int, double> coefs;
    std::vector<int> order;
    double c = 0;
    expression(coefs, order, c);
    no_inf_const();
    m_.obj = terms_of(coefs, order);
    m_.obj_const = c;
    Sec s = section_at(p_);
    if (s == Sec::None && cur().kind != Tk::End) {
      if (cur().kind == Tk::Sense || cur().kind == Tk::Colon || is_label(p_))
        fail("expected 'Subject To' before the constraints (got '" + cur().text + "' in the objective)", cur());
      fail("expected '+' or '-' between objective terms, got '" + cur().text + "'", cur());
    }
    return s;
  }

  // A value moved across a comparison: anything of infinite magnitude becomes exactly +-kLpInf.
  static double clamp_inf(double v) { return lp_is_inf(v) ? (v < 0 ? -kLpInf : kLpInf) : v; }
  // After an expression with variables (or the objective): an infinite constant term there
  // would make the row inf - inf or an infinite lower bound, which CLP asserts on.
  void no_inf_const() {
    if (inf_const_)
      fail("infinite constant '" + inf_const_->text +
           "' in an expression (infinity belongs in bounds and right-hand sides)", *inf_const_);
  }

  // Signed constant (number or +-inf) at the cursor.
  bool constant(double& v) {
    size_t q = p_;
    double sign = 1;
    while (at(q).kind == Tk::Plus || at(q).kind == Tk::Minus) {
      if (at(q).kind == Tk::Minus) sign = -sign;
      ++q;
    }
    if (at(q).kind == Tk::Number) v = sign * at(q).value;
    else if (is_inf_word(at(q))) v = sign * kLpInf;
    else return false;
    if (lp_is_inf(v)) v = v < 0 ? -kLpInf : kLpInf;
    p_ = q + 1;
    return true;
  }
  // After a right-hand side: the next token must start a new statement.
  void after_rhs(const Token& rhs_tok) {
    const Token& nx = cur();
    if (nx.kind == Tk::End || section_at(p_) != Sec::None || is_label(p_)) return;
    if (nx.line != rhs_tok.line) {
      if (nx.kind == Tk::Name || nx.kind == Tk::Number || nx.kind == Tk::Plus || nx.kind == Tk::Minus) return;
    }
    if (nx.kind == Tk::Name || nx.kind == Tk::Plus || nx.kind == Tk::Minus || nx.kind == Tk::Star)
      fail("unexpected '" + nx.text + "' after the right-hand side (variables belong on the left of the comparison)", nx);
    fail("unexpected '" + nx.text + "' after the right-hand side", nx);
  }

  Sec constraints() {
    for (;;) {
      Sec s = section_at(p_);
      if (s != Sec::None || cur().kind == Tk::End) return s;
      const Token& start = cur();
      std::string name;
      if (is_label(p_)) {
        name = cur().text;
        p_ += 2;
      } else {
        name = "c" + std::to_string(m_.rows.size() + 1);
      }
      if (!row_names_.insert(name).second) fail("duplicate constraint name '" + name + "'", start);
      std::map<int, double> coefs;
      std::vector<int> order;
      double c1 = 0;
      const Token& lhs_tok = cur();
      bool vars1 = expression(coefs, order, c1);
      if (vars1) no_inf_const();
      if (cur().kind != Tk::Sense) {
        if (order.empty() && c1 == 0) fail("expected a constraint, got '" + cur().text + "'", cur());
        fail("expected a comparison (<=, >=, =) in constraint '" + name + "', got '" + cur().text + "'", cur());
      }
      const Token& s1 = cur();
      ++p_;
      LpRow row;
      row.name = name;
      if (vars1) {
        double rhs;
        const Token& rtok = cur();
        if (!constant(rhs)) fail("expected a constant right-hand side in constraint '" + name + "', got '" + rtok.text + "'", rtok);
        rhs = clamp_inf(rhs - c1);
        row.sense = s1.sense < 0 ? RowSense::LE : s1.sense > 0 ? RowSense::GE : RowSense::EQ;
        row.rhs = rhs;
        after_rhs(at(p_ - 1));
      } else {
        // constant sense expression [sense constant]
        if (!order.empty() || lhs_tok.kind == Tk::Sense) fail("constraint '" + name + "' has no variables", lhs_tok);
        double c2 = 0;
        const Token& mid = cur();
        if (!expression(coefs, order, c2)) fail("constraint '" + name + "' has no variables", mid);
        no_inf_const();
        if (cur().kind == Tk::Sense) {
          const Token& s2 = cur();
          ++p_;
          double hi;
          if (!constant(hi)) fail("expected a constant bound in range constraint '" + name + "'", cur());
          if (s1.sense == 0 || s2.sense != s1.sense) fail("a range constraint needs two '<=' or two '>='", s2);
          double lo = clamp_inf(c1 - c2);
          hi = clamp_inf(hi - c2);
          if (s1.sense > 0) std::swap(lo, hi);
          row.sense = RowSense::Range;
          row.range_lo = lo;
          row.rhs = hi;
          after_rhs(at(p_ - 1));
        } else {
          // c1 (sense) expr  ==  expr (reversed sense) c1
          row.sense = s1.sense < 0 ? RowSense::GE : s1.sense > 0 ? RowSense::LE : RowSense::EQ;
          row.rhs = clamp_inf(c1 - c2);
          const Token& nx = cur();
          if (nx.kind != Tk::End && section_at(p_) == Sec::None && !is_label(p_) && nx.line == at(p_ - 1).line)
            fail("unexpected '" + nx.text + "' in constraint '" + name + "'", nx);
        }
      }
      row.terms = terms_of(coefs, order);
      m_.rows.push_back(std::move(row));
    }
  }

  Sec bounds() {
    for (;;) {
      Sec s = section_at(p_);
      if (s != Sec::None || cur().kind == Tk::End) return s;
      const Token& start = cur();
      double v1;
      if (constant(v1)) {  // v1 sense x [sense v2]
        if (cur().kind != Tk::Sense) fail("expected a comparison after the bound value, got '" + cur().text + "'", cur());
        int s1 = cur().sense;
        ++p_;
        if (cur().kind != Tk::Name || is_inf_word(cur())) fail("expected a variable name in bound, got '" + cur().text + "'", cur());
        LpVar& v = m_.vars[m_.var(cur().text)];
        ++p_;
        set_bound(v, -s1, v1);  // "l <= x" is x >= l
        if (cur().kind == Tk::Sense) {
          int s2 = cur().sense;
          ++p_;
          double v2;
          if (!constant(v2)) fail("expected a number after the comparison in bound, got '" + cur().text + "'", cur());
          set_bound(v, s2, v2);
        }
        after_rhs(at(p_ - 1));
        continue;
      }
      if (cur().kind != Tk::Name) fail("expected a bound (x <= 5, 0 <= x <= 5, x free), got '" + start.text + "'", start);
      LpVar& v = m_.vars[m_.var(cur().text)];
      ++p_;
      if (cur().kind == Tk::Name && lower(cur().text) == "free") {
        v.lb = -kLpInf;
        v.ub = kLpInf;
        ++p_;
        continue;
      }
      if (cur().kind != Tk::Sense) fail("expected a comparison or 'free' after '" + v.name + "' in Bounds, got '" + cur().text + "'", cur());
      int s1 = cur().sense;
      ++p_;
      double val;
      if (!constant(val)) fail("expected a number in the bound of '" + v.name + "', got '" + cur().text + "'", cur());
      set_bound(v, s1, val);
      after_rhs(at(p_ - 1));
    }
  }
  static void set_bound(LpVar& v, int sense, double val) {
    if (sense <= 0) v.ub = val;   // x <= val or x = val
    if (sense >= 0) v.lb = val;   // x >= val or x = val
  }

  Sec integers(bool binary) {
    for (;;) {
      Sec s = section_at(p_);
      if (s != Sec::None || cur().kind == Tk::End) return s;
      if (cur().kind != Tk::Name) fail("expected a variable name in the " + std::string(binary ? "Binary" : "General") + " section, got '" + cur().text + "'", cur());
      LpVar& v = m_.vars[m_.var(cur().text)];
      v.integer = true;
      if (binary) {
        v.lb = 0;
        v.ub = 1;
      }
      ++p_;
    }
  }
};

}  // namespace

LpParseResult parse_lp(const std::string& text) {
  LpParseResult r;
  try {
    Parser p(lex(text));
    r.model = p.run();
    r.ok = true;
  } catch (const ParseFail& f) {
    r.ok = false;
    r.error = f.msg;
    r.line = f.line;
  }
  return r;
}

}  // namespace trex::orx
