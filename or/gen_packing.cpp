// Category "scheduling", packing families: bin packing and job assignment with machine
// capacities (generalized assignment). Templates t0..t2 train-only, t3 test-only.
#include <algorithm>
#include <cmath>
#include <numeric>
#include "or/generator.h"
#include "or/lp_writer.h"

namespace trex::orx {

namespace {

void build_bin_packing(GenCtx& c, Instance& in) {
  struct Sk { std::string item, items, bin, bins, unit, verb; };
  static const std::vector<Sk> skins = {{"crate", "crates", "truck", "trucks", "kg", "loaded onto"},
                                        {"file", "files", "disk", "disks", "GB", "stored on"},
                                        {"piece", "pieces", "steel bar", "steel bars", "cm", "cut from"},
                                        {"box", "boxes", "container", "containers", "cubic feet", "packed into"}};
  const Sk& sk = c.pick(skins);
  const int n = c.uni(5, 9);
  const double C = c.uni(5, 20) * 10;
  std::vector<double> w(n);
  for (auto& v : w) v = std::round(c.unif(0.15, 0.6) * C);
  if (c.intent == Intent::Infeasible) {
    w[c.uni(0, n - 1)] = C + c.uni(1, 20);
    in.reason = "one " + sk.item + " is larger than the capacity of a " + sk.bin;
  }
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  const int nb = std::min(n, (int)std::ceil(total / C) + 2);
  std::vector<std::string> I;
  for (int i = 0; i < n; ++i) I.push_back(std::to_string(i + 1));
  LpModel& m = in.model;
  std::vector<int> y(nb);
  for (int b = 0; b < nb; ++b) {
    y[b] = m.add_binary("use_" + std::to_string(b + 1));
    m.obj.push_back({y[b], 1});
    in.var_desc.push_back("1 if " + sk.bin + " " + std::to_string(b + 1) + " is used");
  }
  std::vector<std::vector<int>> x(n, std::vector<int>(nb));
  for (int i = 0; i < n; ++i)
    for (int b = 0; b < nb; ++b) {
      x[i][b] = m.add_binary("put_" + I[i] + "_" + std::to_string(b + 1));
      in.var_desc.push_back("1 if " + sk.item + " " + I[i] + " goes to " + sk.bin + " " + std::to_string(b + 1));
    }
  for (int i = 0; i < n; ++i) {
    Terms t;
    for (int b = 0; b < nb; ++b) t.push_back({x[i][b], 1});
    m.add_row("assign_" + I[i], t, RowSense::EQ, 1);
    in.row_desc.push_back(sk.item + " " + I[i] + " placed exactly once");
  }
  for (int b = 0; b < nb; ++b) {
    Terms t;
    for (int i = 0; i < n; ++i) t.push_back({x[i][b], w[i]});
    t.push_back({y[b], -C});
    m.add_row("cap_" + std::to_string(b + 1), t, RowSense::LE, 0);
    in.row_desc.push_back(sk.bin + " " + std::to_string(b + 1) + " holds at most " + c.num(C) + " " + sk.unit + " if used");
  }
  for (int b = 0; b + 1 < nb; ++b) {
    m.add_row("order_" + std::to_string(b + 1), {{y[b], 1}, {y[b + 1], -1}}, RowSense::GE, 0);
    in.row_desc.push_back(sk.bins + " are used in order (symmetry breaking)");
  }
  in.obj_desc = "number of " + sk.bins + " used";
  in.money = false;
  std::vector<std::string> sizes;
  for (int i = 0; i < n; ++i) sizes.push_back(c.num(w[i]));
  std::string intro = c.P({count_word(n) + " " + sk.items + " must be " + sk.verb + " " + sk.bins + ".", "We need to place " + count_word(n) + " " + sk.items + " into " + sk.bins + "."}, {""});
  std::string capx = c.P({"Each " + sk.bin + " has a capacity of " + c.num(C) + " " + sk.unit + ".", "A " + sk.bin + " holds at most " + c.num(C) + " " + sk.unit + "."},
                         {"Capacity per " + sk.bin + ": " + c.num(C) + " " + sk.unit + "."}) +
                     " " + cap1(count_word(nb)) + " " + sk.bins + " are available" + c.P({", and " + sk.items + " cannot be split.", "; a single " + sk.item + " cannot be divided."}, {", each " + sk.item + " stays in one piece."});
  std::string q = " " + c.ask_min("number of " + sk.bins + " needed") + c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    std::vector<std::vector<std::string>> rows;
    for (int i = 0; i < n; ++i) rows.push_back({I[i], sizes[i]});
    s = (c.tmpl == 3 ? "Packing task: all " + sk.items + " listed below must be " + sk.verb + " identical " + sk.bins + "." : cap1(intro)) + "\n\n" +
        md_table({cap1(sk.item), "Size (" + sk.unit + ")"}, rows) + "\n" + capx + q;
  } else if (c.tmpl == 0) {
    s = cap1(intro) + " Their sizes are " + join_and(sizes) + " " + sk.unit + ". " + capx + q;
  } else {
    std::vector<std::string> items;
    for (int i = 0; i < n; ++i) items.push_back(cap1(sk.item) + " " + I[i] + ": " + sizes[i] + " " + sk.unit);
    s = cap1(intro) + "\n" + bullets(items) + capx + q;
  }
  Formulation f;
  std::vector<std::string> B;
  for (int b = 0; b < nb; ++b) B.push_back(std::to_string(b + 1));
  f.sets = {Formulation::set("I", I, sk.items), Formulation::set("B", B, "available " + sk.bins)};
  f.params = {Formulation::param1("w[i] (size)", I, w), "C = " + lp_num(C) + " (capacity)"};
  f.vars = {"y[b] in {0,1}: 1 if " + sk.bin + " b is used", "x[i,b] in {0,1}: 1 if " + sk.item + " i goes into " + sk.bin + " b"};
  f.objective = "minimize sum_{b in B} y[b]";
  f.constraints = {"assign[i]: sum_{b in B} x[i,b] = 1 for each i in I", "capacity[b]: sum_{i in I} w[i] * x[i,b] <= C * y[b] for each b in B",
                   "order[b]: y[b] >= y[b+1] (symmetry breaking)"};
  in.formulation = f.render();
}

// ---------------------------------------------------------------------------------------------
void build_gap(GenCtx& c, Instance& in) {
  static const std::vector<std::string> machines = {"lathe", "mill", "press", "printer", "oven", "robot cell"};
  static const std::vector<std::string> jobnames = {"J1", "J2", "J3", "J4", "J5", "J6", "J7", "J8"};
  const int nj = c.uni(4, 8), nm = c.uni(2, 4);
  auto M = c.sample(machines, nm);
  std::vector<std::string> J(jobnames.begin(), jobnames.begin() + nj);
  const bool same_time = c.coin(0.4);
  std::vector<std::vector<double>> p(nj, std::vector<double>(nm)), cost(nj, std::vector<double>(nm));
  for (int j = 0; j < nj; ++j) {
    const double pj = c.uni(1, 10);
    for (int k = 0; k < nm; ++k) p[j][k] = same_time ? pj : c.uni(1, 10), cost[j][k] = c.uni(5, 50);
  }
  std::vector<double> H(nm, 0);
  if (c.intent == Intent::Infeasible) {
    double need = 0;
    for (int j = 0; j < nj; ++j) need += *std::min_element(p[j].begin(), p[j].end());
    for (auto& h : H) h = std::max(1.0, std::floor(need / nm * c.unif(0.5, 0.8)));
    in.reason = "even the fastest machine for every job needs " + c.num(need) + " hours, more than the total available time";
  } else {
    for (int j = 0; j < nj; ++j) {
      const int k = c.uni(0, nm - 1);
      H[k] += p[j][k];
    }
    for (auto& h : H) h = std::max(4.0, std::ceil(h * c.unif(1.0, 1.4)));
  }
  LpModel& m = in.model;
  for (int j = 0; j < nj; ++j)
    for (int k = 0; k < nm; ++k) {
      m.obj.push_back({m.add_binary("x_" + J[j] + "_" + ident(M[k])), cost[j][k]});
      in.var_desc.push_back("1 if job " + J[j] + " runs on the " + M[k]);
    }
  for (int j = 0; j < nj; ++j) {
    Terms t;
    for (int k = 0; k < nm; ++k) t.push_back({j * nm + k, 1});
    m.add_row("job_" + J[j], t, RowSense::EQ, 1);
    in.row_desc.push_back("job " + J[j] + " assigned to exactly one machine");
  }
  for (int k = 0; k < nm; ++k) {
    Terms t;
    for (int j = 0; j < nj; ++j) t.push_back({j * nm + k, p[j][k]});
    m.add_row("hours_" + ident(M[k]), t, RowSense::LE, H[k]);
    in.row_desc.push_back("the " + M[k] + " works at most " + c.num(H[k]) + " hours");
  }
  in.obj_desc = "total processing cost";
  std::vector<std::string> head = {"Job"};
  for (auto& mk : M) head.push_back(same_time ? "Cost on " + mk : mk + " (hours / cost)");
  if (same_time) head.insert(head.begin() + 1, "Hours");
  std::vector<std::vector<std::string>> rows;
  for (int j = 0; j < nj; ++j) {
    rows.push_back({J[j]});
    if (same_time) rows.back().push_back(c.num(p[j][0]));
    for (int k = 0; k < nm; ++k) rows.back().push_back(same_time ? c.money(cost[j][k]) : c.num(p[j][k]) + " h / " + c.money(cost[j][k]));
  }
  std::vector<std::string> caps;
  for (int k = 0; k < nm; ++k) caps.push_back(c.num(H[k]) + " hours on the " + M[k]);
  std::string rules = c.P({"Every job must be processed on exactly one machine, without splitting.", "Each job goes entirely to one machine."},
                          {"A job cannot be divided between machines, and all jobs must be done."}) +
                      " " + c.P({"Available machine time this week: ", "Machine capacities: "}, {"Hours available: "}) + join_and(caps) + ".";
  std::string q = " " + c.ask_min("total processing cost") + c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    s = (c.tmpl == 3 ? "Shop-floor loading: decide which machine runs each job. Times and costs:"
                     : c.P({"A job shop must assign " + count_word(nj) + " jobs to " + count_word(nm) + " machines (" + join_and(M) + ").", "Jobs are to be allocated to the machines " + join_and(M) + "."}, {""}) +
                           " Processing data:") +
        "\n\n" + md_table(head, rows) + "\n" + rules + q;
  } else {
    s = c.P({"A job shop must assign " + count_word(nj) + " jobs (" + join_and(J) + ") to the machines " + join_and(M) + ".", "A plant has jobs " + join_and(J) + " and machines " + join_and(M) + "."}, {""});
    std::vector<std::string> lines;
    for (int j = 0; j < nj; ++j) {
      std::vector<std::string> parts;
      for (int k = 0; k < nm; ++k)
        parts.push_back(same_time ? c.money(cost[j][k]) + " on the " + M[k] : c.num(p[j][k]) + " hours and " + c.money(cost[j][k]) + " on the " + M[k]);
      lines.push_back("Job " + J[j] + (same_time ? " takes " + c.num(p[j][0]) + " hours on any machine and costs " : " needs ") + join_and(parts));
    }
    s += c.tmpl == 2 ? "\n" + bullets(lines) + rules + q : " " + join(lines, ". ") + ". " + rules + q;
  }
  Formulation f;
  f.sets = {Formulation::set("J", J, "jobs"), Formulation::set("M", M, "machines")};
  f.params = {Formulation::param2("p[j,m] (hours)", J, M, p), Formulation::param2("c[j,m] (cost)", J, M, cost), Formulation::param1("H[m] (hours available)", M, H)};
  f.vars = {"x[j,m] in {0,1}: 1 if job j runs on machine m"};
  f.objective = "minimize sum_{j in J, m in M} c[j,m] * x[j,m]";
  f.constraints = {"assign[j]: sum_{m in M} x[j,m] = 1 for each j in J", "capacity[m]: sum_{j in J} p[j,m] * x[j,m] <= H[m] for each m in M"};
  in.formulation = f.render();
}

}  // namespace

void add_packing_families(std::vector<Family>& out) {
  out.push_back({"scheduling", "bin_packing", 3, 1, true, false, build_bin_packing});
  out.push_back({"scheduling", "job_assignment", 3, 1, true, false, build_gap});
}

}  // namespace trex::orx
