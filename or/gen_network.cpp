// Category "network": transportation, assignment, min-cost flow, shortest path, max flow.
// Templates t0..t2 train-only, t3 test-only.
#include <algorithm>
#include <cmath>
#include <numeric>
#include "or/generator.h"
#include "or/lp_writer.h"

namespace trex::orx {

namespace {

void build_transportation(GenCtx& c, Instance& in) {
  static const std::vector<std::string> src = {"Atlanta", "Buffalo", "Cleveland", "Dallas", "El Paso", "Phoenix"};
  static const std::vector<std::string> dst = {"Miami", "Seattle", "Denver", "Boise", "Newark", "Tampa", "Salem", "Provo"};
  struct Sk { std::string s, ss, d, ds, unit; };
  static const std::vector<Sk> skins = {{"plant", "plants", "warehouse", "warehouses", "tons"}, {"farm", "farms", "market", "markets", "crates"},
                                        {"refinery", "refineries", "depot", "depots", "kiloliters"}};
  const Sk& sk = c.pick(skins);
  const int ns = c.uni(2, 4), nd = c.uni(2, 5);
  auto S = c.sample(src, ns), D = c.sample(dst, nd);
  std::vector<double> sup(ns), dem(nd);
  std::vector<std::vector<double>> cost(ns, std::vector<double>(nd));
  std::vector<std::vector<char>> ok(ns, std::vector<char>(nd, 1));
  double td = 0;
  for (int j = 0; j < nd; ++j) td += dem[j] = c.uni(10, 90) * (c.coin(0.3) ? 10 : 1);
  const double slack = c.intent == Intent::Infeasible ? c.unif(0.7, 0.95) : c.unif(1.0, 1.4);
  double left = std::ceil(td * slack);
  for (int i = 0; i < ns; ++i) {
    sup[i] = i + 1 == ns ? std::max(1.0, left) : std::max(1.0, std::round(td * slack / ns * c.unif(0.7, 1.3)));
    left -= sup[i];
    for (int j = 0; j < nd; ++j) cost[i][j] = c.uni(1, 30), ok[i][j] = !c.coin(0.12);
  }
  if (c.intent != Intent::Infeasible) {
    const double ts = std::accumulate(sup.begin(), sup.end(), 0.0);
    if (ts < td) sup[0] += td - ts;
  } else {
    const double ts = std::accumulate(sup.begin(), sup.end(), 0.0);
    if (ts >= td) sup[0] -= ts - td + c.uni(1, 20);
    sup[0] = std::max(1.0, sup[0]);
    in.reason = "total supply is smaller than the total demand of " + c.num(td) + " " + sk.unit;
  }
  for (int j = 0; j < nd; ++j) ok[c.uni(0, ns - 1)][j] = 1;
  const bool eq = c.coin(0.5), integer = c.coin(0.3);
  LpModel& m = in.model;
  std::vector<std::vector<int>> x(ns, std::vector<int>(nd, -1));
  for (int i = 0; i < ns; ++i)
    for (int j = 0; j < nd; ++j)
      if (ok[i][j]) {
        x[i][j] = m.add_var("x_" + ident(S[i]) + "_" + ident(D[j]), 0, kLpInf, integer);
        m.obj.push_back({x[i][j], cost[i][j]});
        in.var_desc.push_back(sk.unit + " shipped from " + S[i] + " to " + D[j]);
      }
  for (int i = 0; i < ns; ++i) {
    Terms t;
    for (int j = 0; j < nd; ++j)
      if (x[i][j] >= 0) t.push_back({x[i][j], 1});
    if (t.empty()) continue;
    m.add_row("supply_" + ident(S[i]), t, RowSense::LE, sup[i]);
    in.row_desc.push_back(S[i] + " ships at most " + c.num(sup[i]) + " " + sk.unit);
  }
  for (int j = 0; j < nd; ++j) {
    Terms t;
    for (int i = 0; i < ns; ++i)
      if (x[i][j] >= 0) t.push_back({x[i][j], 1});
    m.add_row("demand_" + ident(D[j]), t, eq ? RowSense::EQ : RowSense::GE, dem[j]);
    in.row_desc.push_back(D[j] + " receives " + (eq ? "exactly " : "at least ") + c.num(dem[j]) + " " + sk.unit);
  }
  in.obj_desc = "total shipping cost";
  std::vector<std::string> head = {"From \\ To"}, ss, ds, missing;
  for (auto& d : D) head.push_back(d);
  std::vector<std::vector<std::string>> rows;
  for (int i = 0; i < ns; ++i) {
    rows.push_back({S[i]});
    for (int j = 0; j < nd; ++j) rows.back().push_back(ok[i][j] ? c.money(cost[i][j]) : "-");
    ss.push_back(S[i] + " " + c.num(sup[i]));
  }
  for (int j = 0; j < nd; ++j) ds.push_back(D[j] + " " + c.num(dem[j]));
  for (int i = 0; i < ns; ++i)
    for (int j = 0; j < nd; ++j)
      if (!ok[i][j]) missing.push_back(S[i] + " to " + D[j]);
  std::string miss_s = missing.empty() ? "" : " " + c.P({"There is no route from ", "Shipping is impossible from "}, {"No lane exists from "}) + join_and(missing) + ".";
  std::string rules = " " + c.P({"Supplies (" + sk.unit + "): ", "Available at the " + sk.ss + ": "}, {"Capacity by origin: "}) + join_and(ss) + ". " +
                      c.P({"Demands (" + sk.unit + "): ", "Required at the " + sk.ds + ": "}, {"Needs by destination: "}) + join_and(ds) + "." +
                      (eq ? " " + c.P({"Each " + sk.d + " must receive exactly its demand.", "Deliveries must match demand exactly."}, {"No destination may be over-supplied."})
                          : " " + c.P({"Each " + sk.d + " must receive at least its demand.", "Demand must be covered."}, {"Every destination needs at least its requirement."})) +
                      (integer ? " " + c.P({"Shipments are whole truckloads, so amounts must be integers."}, {"Only integer amounts can be shipped."}) : "");
  std::string q = " " + c.ask_min("total transportation cost") + c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    s = (c.tmpl == 3 ? "Logistics question. Our " + sk.ss + " in " + join_and(S) + " supply " + sk.ds + " in " + join_and(D) + ". Cost per unit shipped:"
                     : c.P({"A company ships goods from its " + sk.ss + " to its " + sk.ds + ". The cost per " + sk.unit.substr(0, sk.unit.size() - 1) + " is:",
                            "Unit transportation costs between " + sk.ss + " and " + sk.ds + " are given below."}, {""})) +
        "\n\n" + md_table(head, rows) + "\n" + rules.substr(1) + miss_s + q;
  } else {
    s = c.P({"Goods are shipped from " + count_word(ns) + " " + sk.ss + " (" + join_and(S) + ") to " + count_word(nd) + " " + sk.ds + " (" + join_and(D) + ").",
             "A distributor moves " + sk.unit + " from " + sk.ss + " in " + join_and(S) + " to " + sk.ds + " in " + join_and(D) + "."}, {""});
    for (int i = 0; i < ns; ++i) {
      std::vector<std::string> parts;
      for (int j = 0; j < nd; ++j)
        if (ok[i][j]) parts.push_back(c.money(cost[i][j]) + " to " + D[j]);
      s += (c.tmpl == 2 ? "\n- From " : " From ") + S[i] + ", one unit costs " + join_and(parts) + (c.tmpl == 2 ? "" : ".");
    }
    s += (c.tmpl == 2 ? "\n" + rules.substr(1) : rules) + miss_s + q;
  }
  Formulation f;
  f.sets = {Formulation::set("S", S, sk.ss), Formulation::set("D", D, sk.ds), "A: the usable routes (i,j)" + std::string(missing.empty() ? " (all pairs)" : "")};
  std::vector<std::vector<double>> cm = cost;
  f.params = {Formulation::param1("supply[i]", S, sup), Formulation::param1("demand[j]", D, dem), Formulation::param2("c[i,j] (cost per unit)", S, D, cm)};
  if (!missing.empty()) f.params.push_back("routes not in A: " + join_and(missing));
  f.vars = {std::string("x[i,j] >= 0") + (integer ? " integer" : "") + " for (i,j) in A: amount shipped from i to j"};
  f.objective = "minimize sum_{(i,j) in A} c[i,j] * x[i,j]";
  f.constraints = {"supply[i]: sum_j x[i,j] <= supply[i] for each i in S", std::string("demand[j]: sum_i x[i,j] ") + (eq ? "=" : ">=") + " demand[j] for each j in D"};
  in.formulation = f.render();
}

// ---------------------------------------------------------------------------------------------
void build_assignment(GenCtx& c, Instance& in) {
  static const std::vector<std::string> people = {"Ana", "Ben", "Chloe", "Dev", "Eva", "Farid", "Grace", "Hugo", "Iris"};
  static const std::vector<std::string> jobs = {"audit", "design", "testing", "support", "training", "reporting", "logistics", "sales"};
  const bool maxi = c.coin(0.3);
  const int n = c.uni(3, 6);
  int mt = c.coin(0.3) ? c.uni(2, n - 1) : n;
  if (c.intent == Intent::Infeasible) {
    mt = n + 1;
    in.reason = "there are more tasks than workers and each worker can take only one task";
  }
  auto W = c.sample(people, n), J = c.sample(jobs, mt);
  std::vector<std::vector<double>> v(n, std::vector<double>(mt));
  for (auto& r : v)
    for (auto& e : r) e = maxi ? c.uni(1, 10) * (c.coin(0.5) ? 10 : 1) : c.uni(5, 60);
  const std::string what = maxi ? "total performance score" : c.pick({"total completion time", "total cost"});
  const bool money = !maxi && what == "total cost";
  auto fmt = [&](double e) { return money ? c.money(e) : maxi ? c.num(e) : c.num(e) + " min"; };
  LpModel& m = in.model;
  m.maximize = maxi;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < mt; ++j) {
      int k = m.add_binary("a_" + ident(W[i]) + "_" + ident(J[j]));
      m.obj.push_back({k, v[i][j]});
      in.var_desc.push_back("1 if " + W[i] + " does " + J[j]);
    }
  for (int j = 0; j < mt; ++j) {
    Terms t;
    for (int i = 0; i < n; ++i) t.push_back({i * mt + j, 1});
    m.add_row("task_" + ident(J[j]), t, RowSense::EQ, 1);
    in.row_desc.push_back(J[j] + " is done by exactly one person");
  }
  for (int i = 0; i < n; ++i) {
    Terms t;
    for (int j = 0; j < mt; ++j) t.push_back({i * mt + j, 1});
    m.add_row("worker_" + ident(W[i]), t, mt == n ? RowSense::EQ : RowSense::LE, 1);
    in.row_desc.push_back(W[i] + (mt == n ? " takes exactly one task" : " takes at most one task"));
  }
  in.obj_desc = what;
  in.money = money;
  std::vector<std::string> head = {"Worker"};
  for (auto& j : J) head.push_back(j);
  std::vector<std::vector<std::string>> rows;
  for (int i = 0; i < n; ++i) {
    rows.push_back({W[i]});
    for (int j = 0; j < mt; ++j) rows.back().push_back(fmt(v[i][j]));
  }
  const std::string meas = maxi ? "score" : money ? "cost" : "time";
  std::string rule = " " + c.P({"Each task must be given to exactly one worker, and each worker can take at most one task.",
                                "Every task needs one worker; nobody can do more than one task."},
                               {"One person per task, and no person handles two tasks."});
  std::string q = " " + (maxi ? c.ask_max(what) : c.ask_min(what)) + c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 0 || c.tmpl == 2) {
    s = c.P({"A manager must assign " + count_word(mt) + " tasks (" + join_and(J) + ") to " + count_word(n) + " workers (" + join_and(W) + ").",
             "There are " + count_word(mt) + " tasks, " + join_and(J) + ", and " + count_word(n) + " staff members, " + join_and(W) + "."}, {""}) +
        rule;
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> parts;
      for (int j = 0; j < mt; ++j) parts.push_back(fmt(v[i][j]) + " for " + J[j]);
      s += (c.tmpl == 2 ? "\n- " + W[i] + ": " : " " + W[i] + "'s " + meas + " is ") + join_and(parts) + (c.tmpl == 2 ? "" : ".");
    }
    s += (c.tmpl == 2 ? "\n" + q.substr(1) : q);
  } else {
    s = (c.tmpl == 3 ? "Staffing puzzle: the table lists each person's " + meas + " on each job." : c.P({"The " + meas + " of each worker on each task is:", "Assignment data (" + meas + "):"}, {""})) +
        "\n\n" + md_table(head, rows) + "\n" + rule.substr(1) + q;
  }
  Formulation f;
  f.sets = {Formulation::set("W", W, "workers"), Formulation::set("J", J, "tasks")};
  f.params = {Formulation::param2("v[w,j] (" + meas + ")", W, J, v)};
  f.vars = {"x[w,j] in {0,1}: 1 if worker w does task j"};
  f.objective = std::string(maxi ? "maximize" : "minimize") + " sum_{w in W, j in J} v[w,j] * x[w,j]";
  f.constraints = {"task[j]: sum_{w in W} x[w,j] = 1 for each j in J", std::string("worker[w]: sum_{j in J} x[w,j] ") + (mt == n ? "=" : "<=") + " 1 for each w in W"};
  in.formulation = f.render();
}

}  // namespace

void add_graph_families(std::vector<Family>& out);  // or/gen_graph.cpp

void add_network_families(std::vector<Family>& out) {
  out.push_back({"network", "transportation", 3, 1, true, false, build_transportation});
  out.push_back({"network", "assignment", 3, 1, true, false, build_assignment});
  add_graph_families(out);
}

}  // namespace trex::orx
