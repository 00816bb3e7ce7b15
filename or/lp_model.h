// In-memory linear / mixed-integer model: the common currency of the LP writer, the LP parser,
// the MPS reader and the solvers.
//   min|max  c^T x + c0
//   s.t.     row r: sum_j a_rj x_j  (<= | >= | =) rhs_r      or  lo_r <= sum_j a_rj x_j <= rhs_r
//            lb_j <= x_j <= ub_j,  x_j integer for j in J_int
// Infinite bounds are +-kLpInf (any magnitude >= 1e20 reads as infinite).
#pragma once
#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

namespace trex::orx {

inline constexpr double kLpInf = 1e30;
inline bool lp_is_inf(double v) { return std::fabs(v) >= 1e20; }

struct LpTerm {
  int var;      // index into LpModel::vars
  double coef;
};

using Terms = std::vector<LpTerm>;  // a sparse linear expression

struct LpVar {
  std::string name;
  double lb = 0, ub = kLpInf;
  bool integer = false;
  bool is_binary() const { return integer && lb == 0 && ub == 1; }
};

enum class RowSense { LE, GE, EQ, Range };

struct LpRow {
  std::string name;
  std::vector<LpTerm> terms;
  RowSense sense = RowSense::LE;
  double rhs = 0;     // LE: upper, GE: lower, EQ: value, Range: upper
  double range_lo = 0;  // Range only: lower
  double lower() const { return sense == RowSense::LE ? -kLpInf : sense == RowSense::Range ? range_lo : rhs; }
  double upper() const { return sense == RowSense::GE ? kLpInf : rhs; }
};

struct LpModel {
  bool maximize = false;
  std::string obj_name = "obj";
  std::vector<LpTerm> obj;
  double obj_const = 0;
  std::vector<LpVar> vars;
  std::vector<LpRow> rows;
  std::unordered_map<std::string, int> index;  // variable name -> position in vars

  // Index of variable `name`, created with default bounds [0, inf) if new.
  int var(const std::string& name) {
    auto it = index.find(name);
    if (it != index.end()) return it->second;
    vars.push_back({name});
    index.emplace(name, (int)vars.size() - 1);
    return (int)vars.size() - 1;
  }
  int find(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? -1 : it->second;
  }
  // Convenience for builders: a new variable with bounds and integrality (name must be new).
  int add_var(const std::string& name, double lb = 0, double ub = kLpInf, bool integer = false) {
    int j = var(name);
    vars[j].lb = lb;
    vars[j].ub = ub;
    vars[j].integer = integer;
    return j;
  }
  int add_binary(const std::string& name) { return add_var(name, 0, 1, true); }
  LpRow& add_row(const std::string& name, std::vector<LpTerm> terms, RowSense s, double rhs) {
    rows.push_back({name, std::move(terms), s, rhs, 0});
    return rows.back();
  }
  bool has_integers() const {
    for (const auto& v : vars)
      if (v.integer) return true;
    return false;
  }
};

}  // namespace trex::orx
