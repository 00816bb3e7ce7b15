// Category "scheduling": shift staffing, set cover, bin packing, job assignment with machine
// capacities (generalized assignment). Templates t0..t2 train-only, t3 test-only.
#include <algorithm>
#include <cmath>
#include <numeric>
#include "or/generator.h"
#include "or/lp_writer.h"

namespace trex::orx {

namespace {

void build_staffing(GenCtx& c, Instance& in) {
  // Either 7 days with 5-day stretches, or 6 four-hour blocks with 8-hour shifts.
  const bool days = c.coin(0.5);
  static const std::vector<std::string> dnames = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
  static const std::vector<std::string> bnames = {"00-04", "04-08", "08-12", "12-16", "16-20", "20-24"};
  const std::vector<std::string>& P = days ? dnames : bnames;
  const int np = (int)P.size(), len = days ? 5 : 2;
  const std::string who = c.pick({"nurses", "agents", "guards", "drivers"});
  const std::string org = who == "nurses" ? "A hospital ward" : who == "agents" ? "A call center" : who == "guards" ? "A security firm" : "A bus depot";
  std::vector<double> req(np), cost(np);
  for (int p = 0; p < np; ++p) req[p] = c.uni(days ? 8 : 3, days ? 25 : 20);
  const bool uniform = c.coin(0.4);
  for (int p = 0; p < np; ++p) cost[p] = uniform ? 1 : c.stepped(days ? 500 : 80, days ? 900 : 200, 10);
  if (!uniform && days) cost[5] += 100, cost[6] += 100;  // weekend premium appears as its own number
  double ub = -1;
  if (c.intent == Intent::Infeasible) {
    const int p = c.uni(0, np - 1);
    ub = std::max(1.0, std::floor(req[p] / len) - 1);
    req[p] = std::max(req[p], ub * len + c.uni(1, 3));
    in.reason = "at most " + c.num(ub) + " " + who + " per shift cannot cover the " + c.num(req[p]) + " needed in period " + P[p];
  } else if (c.coin(0.3)) {
    ub = std::ceil(*std::max_element(req.begin(), req.end()) * c.unif(0.6, 1.0));
  }
  LpModel& m = in.model;
  std::vector<int> x(np);
  for (int p = 0; p < np; ++p) {
    x[p] = m.add_var("start_" + ident(days ? P[p].substr(0, 3) : "h" + P[p].substr(0, 2)), 0, ub > 0 ? ub : kLpInf, true);
    m.obj.push_back({x[p], cost[p]});
    in.var_desc.push_back(who + " whose shift starts " + (days ? "on " : "at ") + (days ? P[p] : P[p].substr(0, 2) + ":00"));
  }
  for (int p = 0; p < np; ++p) {
    Terms t;
    for (int k = 0; k < len; ++k) t.push_back({x[(p - k + np) % np], 1});
    m.add_row("cover_" + ident(days ? P[p].substr(0, 3) : "h" + P[p].substr(0, 2)), t, RowSense::GE, req[p]);
    in.row_desc.push_back("at least " + c.num(req[p]) + " " + who + " on duty in " + P[p]);
  }
  in.obj_desc = uniform ? "number of " + who + " employed" : "total wage cost";
  in.money = !uniform;
  std::string shift = days ? c.P({"Each of the " + who + " works five consecutive days and then has two days off; the pattern repeats every week.",
                                  "Every employee works 5 days in a row followed by 2 days off (the week wraps around)."},
                                 {"Schedules are five straight working days, then two days of rest, cyclically."})
                           : c.P({"A shift lasts eight hours, i.e. two consecutive blocks, and can start at the beginning of any block (the day wraps around).",
                                  "Shifts are 8 hours long and start at 00:00, 04:00, 08:00, 12:00, 16:00 or 20:00; a shift starting at 20:00 ends at 04:00."},
                                 {"Each person covers two back-to-back four-hour blocks, starting at any block boundary; midnight wraps."});
  std::vector<std::string> reqs, costs;
  for (int p = 0; p < np; ++p) reqs.push_back(P[p] + ": " + c.num(req[p]));
  for (int p = 0; p < np; ++p) costs.push_back(P[p] + " " + c.money(cost[p]));
  std::string pay = uniform ? "" : " " + c.P({"The cost of a " + who.substr(0, who.size() - 1) + " depends on the start of the shift: ", "Wages by starting " + std::string(days ? "day" : "block") + ": "},
                                               {"Pay per person, by start: "}) + join_and(costs) + ".";
  std::string cap = ub > 0 ? " " + c.P({"At most " + c.num(ub) + " " + who + " can start on the same shift.", "No more than " + c.num(ub) + " " + who + " may share a starting time."},
                                       {"The roster allows at most " + c.num(ub) + " starts per shift."}) : "";
  std::string q = " " + (uniform ? c.ask_min("number of " + who + " needed") : c.ask_min("total wage cost")) + c.maybe_infeasible_note();
  std::string& s = in.statement;
  std::vector<std::vector<std::string>> rows;
  for (int p = 0; p < np; ++p) {
    rows.push_back({P[p], c.num(req[p])});
    if (!uniform) rows.back().push_back(c.money(cost[p]));
  }
  std::vector<std::string> head = {days ? "Day" : "Block", "Required"};
  if (!uniform) head.push_back("Cost of a shift starting here");
  if (c.tmpl == 1 || c.tmpl == 3) {
    s = (c.tmpl == 3 ? "Rostering request. " + org + " needs " + who + " on duty as follows:"
                     : org + " " + c.P({"must staff every " + std::string(days ? "day" : "four-hour block") + " with enough " + who + ":", "sets minimum staffing levels:"}, {""})) +
        "\n\n" + md_table(head, rows) + "\n" + shift + cap + q;
  } else {
    s = org + " " + c.P({"needs a minimum number of " + who + " on duty in each " + std::string(days ? "day of the week" : "four-hour block of the day") + ".",
                         "plans its " + who + " roster."}, {""}) + " " + shift;
    s += c.tmpl == 2 ? "\nRequirements:\n" + bullets(reqs) : " The requirements are " + join_and(reqs) + ".";
    s += pay + cap + q;
  }
  Formulation f;
  f.sets = {Formulation::set("P", P, days ? "days (cyclic)" : "four-hour blocks (cyclic)"),
            std::string("cover(p): the ") + (days ? "5 start days p, p-1, ..., p-4" : "2 start blocks p and p-1") + " (cyclic) whose shift includes period p"};
  f.params = {Formulation::param1("r[p] (required staff)", P, req)};
  if (!uniform) f.params.push_back(Formulation::param1("c[p] (cost of a shift starting in p)", P, cost));
  f.vars = {"x[p] >= 0 integer: staff starting their shift in period p" + std::string(ub > 0 ? ", x[p] <= " + c.num(ub) : "")};
  f.objective = std::string("minimize sum_{p in P} ") + (uniform ? "x[p]" : "c[p] * x[p]");
  f.constraints = {"coverage[p]: sum_{q in cover(p)} x[q] >= r[p] for each p in P"};
  in.formulation = f.render();
}

// ---------------------------------------------------------------------------------------------
void build_set_cover(GenCtx& c, Instance& in) {
  static const std::vector<std::string> sites = {"Northgate", "Riverside", "Hilltop", "Old Mill", "Lakeview", "Station Road", "Parkside", "Elm Park"};
  const std::string what = c.pick({"fire stations", "ambulance bases", "cell towers", "warehouses"});
  const int ne = c.uni(6, 10), ns = c.uni(4, 7);
  auto S = c.sample(sites, ns);
  std::vector<std::string> E;
  for (int e = 0; e < ne; ++e) E.push_back("zone " + std::to_string(e + 1));
  std::vector<std::vector<char>> cov(ns, std::vector<char>(ne, 0));
  for (int s = 0; s < ns; ++s)
    for (int k = c.uni(2, 4); k > 0; --k) cov[s][c.uni(0, ne - 1)] = 1;
  for (int e = 0; e < ne; ++e) {
    bool any = false;
    for (int s = 0; s < ns; ++s) any |= cov[s][e];
    if (!any) cov[c.uni(0, ns - 1)][e] = 1;
  }
  const bool unit_cost = c.coin(0.3);
  std::vector<double> cost(ns);
  for (auto& v : cost) v = unit_cost ? 1 : c.stepped(50, 400, 5) * 1000;
  int kmax = -1;
  if (c.intent == Intent::Infeasible) {
    kmax = 1;
    in.reason = "no single site covers every zone, yet only one may be opened";
  }
  std::vector<double> need(ne, 1);
  if (c.coin(0.2)) {
    const int e = c.uni(0, ne - 1);
    int n_cov = 0;
    for (int s = 0; s < ns; ++s) n_cov += cov[s][e];
    if (n_cov >= 2) need[e] = 2;
  }
  LpModel& m = in.model;
  for (int s = 0; s < ns; ++s) {
    m.obj.push_back({m.add_binary("open_" + ident(S[s])), cost[s]});
    in.var_desc.push_back("1 if a site is built at " + S[s]);
  }
  for (int e = 0; e < ne; ++e) {
    Terms t;
    for (int s = 0; s < ns; ++s)
      if (cov[s][e]) t.push_back({s, 1});
    m.add_row("cover_" + ident(E[e]), t, RowSense::GE, need[e]);
    in.row_desc.push_back(E[e] + " covered " + (need[e] > 1 ? "at least twice" : "at least once"));
  }
  if (kmax > 0) {
    Terms t;
    for (int s = 0; s < ns; ++s) t.push_back({s, 1});
    m.add_row("max_sites", t, RowSense::LE, kmax);
    in.row_desc.push_back("at most " + c.num(kmax) + " site");
  }
  in.obj_desc = unit_cost ? "number of " + what : "total construction cost";
  in.money = !unit_cost;
  std::vector<std::string> lines;
  for (int s = 0; s < ns; ++s) {
    std::vector<std::string> z;
    for (int e = 0; e < ne; ++e)
      if (cov[s][e]) z.push_back(std::to_string(e + 1));
    lines.push_back(S[s] + (unit_cost ? "" : " (cost " + c.money(cost[s]) + ")") + " covers zones " + join_and(z));
  }
  std::string extra;
  for (int e = 0; e < ne; ++e)
    if (need[e] > 1) extra += " " + cap1(E[e]) + c.P({" is high-risk and must be covered by at least 2 sites.", " needs coverage from 2 or more sites."}, {" requires double coverage (2 sites)."});
  if (kmax > 0) extra += " " + c.P({"The budget allows only 1 site to be opened.", "At most 1 site can be built."}, {"Only 1 site may be selected."});
  std::string q = " " + (unit_cost ? c.ask_min("number of " + what) : c.ask_min("total construction cost")) + c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    std::vector<std::string> head = {"Site"};
    if (!unit_cost) head.push_back("Cost");
    for (int e = 0; e < ne; ++e) head.push_back(std::to_string(e + 1));
    std::vector<std::vector<std::string>> rows;
    for (int k = 0; k < ns; ++k) {
      rows.push_back({S[k]});
      if (!unit_cost) rows.back().push_back(c.money(cost[k]));
      for (int e = 0; e < ne; ++e) rows.back().push_back(cov[k][e] ? "x" : "");
    }
    s = (c.tmpl == 3 ? "Coverage planning: " + count_word(ne) + " zones (numbered 1 to " + std::to_string(ne) + ") must each be served by " + what + ". An x marks the zones a candidate site serves:"
                     : c.P({"A city wants to place " + what + " so that each of its " + count_word(ne) + " zones is covered.", "The council chooses locations for " + what + "."}, {""}) +
                           " Zones covered by each candidate site (x = covered):") +
        "\n\n" + md_table(head, rows) + extra + q;
  } else {
    s = c.P({"A city wants to place " + what + " so that each of its " + count_word(ne) + " zones (1 to " + std::to_string(ne) + ") is covered by at least one of them.",
             "Every one of " + count_word(ne) + " zones, numbered 1 to " + std::to_string(ne) + ", must be within reach of an open site."}, {""}) +
        (c.tmpl == 2 ? "\n" + bullets(lines) : " " + join(lines, "; ") + ".") + extra + q;
  }
  Formulation f;
  std::vector<std::string> covs;
  for (int k = 0; k < ns; ++k) {
    std::vector<std::string> z;
    for (int e = 0; e < ne; ++e)
      if (cov[k][e]) z.push_back(E[e]);
    covs.push_back(S[k] + " covers {" + join(z, ", ") + "}");
  }
  f.sets = {Formulation::set("S", S, "candidate sites"), Formulation::set("Z", E, "zones"), "cov(z): the sites covering zone z; " + join(covs, "; ")};
  if (!unit_cost) f.params.push_back(Formulation::param1("c[s] (cost)", S, cost));
  f.params.push_back(Formulation::param1("need[z] (times covered)", E, need));
  f.vars = {"y[s] in {0,1}: 1 if site s is opened"};
  f.objective = unit_cost ? "minimize sum_{s in S} y[s]" : "minimize sum_{s in S} c[s] * y[s]";
  f.constraints = {"cover[z]: sum_{s in cov(z)} y[s] >= need[z] for each z in Z"};
  if (kmax > 0) f.constraints.push_back("budget: sum_{s in S} y[s] <= 1");
  in.formulation = f.render();
}

}  // namespace

void add_packing_families(std::vector<Family>& out);  // or/gen_packing.cpp

void add_sched_families(std::vector<Family>& out) {
  out.push_back({"scheduling", "staffing", 3, 1, true, false, build_staffing});
  out.push_back({"scheduling", "set_cover", 3, 1, true, false, build_set_cover});
  add_packing_families(out);
}

}  // namespace trex::orx
