// Category "ip": integer and mixed-integer programs. Families: knapsack, facility location,
// fixed charge, lot sizing. Templates t0..t2 train-only, t3 test-only.
#include <algorithm>
#include <cmath>
#include <numeric>
#include "or/generator.h"
#include "or/lp_writer.h"

namespace trex::orx {

namespace {

struct KnapSkin {
  std::string story, item, items, wname, wunit, vname, vunit;  // vunit "" = money
  std::vector<std::string> names;
  int wlo, whi, vlo, vhi;
};

void build_knapsack(GenCtx& c, Instance& in) {
  static const std::vector<KnapSkin> skins = {
      {"A company is choosing capital projects for next year.", "project", "projects", "cost", "thousand dollars", "net present value", "thousand dollars",
       {"solar retrofit", "warehouse automation", "CRM upgrade", "new product line", "fleet renewal", "training program", "data center",
        "marketing campaign", "R&D lab", "recycling unit"}, 20, 200, 10, 150},
      {"A relief plane is being loaded with supplies.", "crate", "crates", "weight", "kg", "priority score", "points",
       {"generator", "tents", "water pump", "medical kit", "radios", "solar panels", "food pallet", "tool chest", "blankets", "water filters"}, 30, 400, 5, 90},
      {"A hiker is packing for a long trek.", "item", "items", "weight", "grams", "usefulness", "points",
       {"tent", "stove", "camera", "book", "water filter", "first-aid kit", "binoculars", "rain jacket", "extra food", "GPS unit"}, 100, 2500, 1, 40},
      {"A freight broker selects shipments for a single truck.", "shipment", "shipments", "weight", "kg", "revenue", "",
       {"shipment A", "shipment B", "shipment C", "shipment D", "shipment E", "shipment F", "shipment G", "shipment H", "shipment I", "shipment J"}, 100, 900, 50, 800},
  };
  const KnapSkin& sk = c.pick(skins);
  const int n = c.uni(5, 10);
  auto I = c.sample(sk.names, n);
  std::vector<double> w(n), v(n);
  for (int i = 0; i < n; ++i) w[i] = c.uni(sk.wlo, sk.whi), v[i] = c.uni(sk.vlo, sk.vhi);
  const double W = std::floor(std::accumulate(w.begin(), w.end(), 0.0) * c.unif(0.35, 0.6));
  std::vector<int> must;
  int ca = -1, cb = -1, da = -1, db = -1;
  if (c.intent == Intent::Infeasible) {
    std::vector<int> ord(n);
    std::iota(ord.begin(), ord.end(), 0);
    std::sort(ord.begin(), ord.end(), [&](int a, int b) { return w[a] > w[b]; });
    double tot = 0;
    for (int i : ord) {
      must.push_back(i);
      if ((tot += w[i]) > W) break;
    }
    in.reason = "the required " + sk.items + " alone weigh more than the limit of " + c.num(W);
  } else if (c.coin(0.15)) {
    must.push_back(c.uni(0, n - 1));
  }
  if (c.coin(0.3)) ca = c.uni(0, n - 1), cb = (ca + c.uni(1, n - 1)) % n;
  if (c.coin(0.2)) da = c.uni(0, n - 1), db = (da + c.uni(1, n - 1)) % n;
  auto val = [&](double x) { return sk.vunit.empty() ? c.money(x) : c.num(x) + " " + sk.vunit; };

  LpModel& m = in.model;
  m.maximize = true;
  const std::string pre = c.pick({"x_", "take_", "pick_", "y_"});
  Terms wt;
  for (int i = 0; i < n; ++i) {
    const bool req = std::find(must.begin(), must.end(), i) != must.end();
    int j = m.add_var(pre + ident(I[i]), req ? 1 : 0, 1, true);
    m.obj.push_back({j, v[i]});
    wt.push_back({j, w[i]});
    in.var_desc.push_back("1 if the " + I[i] + " " + sk.item + " is selected");
  }
  m.add_row("capacity", wt, RowSense::LE, W);
  in.row_desc.push_back("total " + sk.wname + " within " + c.num(W) + " " + sk.wunit);
  if (ca >= 0) {
    m.add_row("conflict", {{ca, 1}, {cb, 1}}, RowSense::LE, 1);
    in.row_desc.push_back("at most one of " + I[ca] + " and " + I[cb]);
  }
  if (da >= 0) {
    m.add_row("depends", {{db, 1}, {da, -1}}, RowSense::LE, 0);
    in.row_desc.push_back(I[db] + " only together with " + I[da]);
  }
  in.obj_desc = "total " + sk.vname;
  in.money = sk.vunit.empty();

  std::string rules;
  for (int i : must) rules += " " + cap1(I[i]) + c.P({" must be included.", " is mandatory."}, {" has to be taken."});
  if (ca >= 0) rules += " " + c.P({"At most one of " + I[ca] + " and " + I[cb] + " can be chosen.", I[ca] + " and " + I[cb] + " exclude each other."},
                                  {"Choosing both " + I[ca] + " and " + I[cb] + " is not allowed."});
  if (da >= 0) rules += " " + c.P({cap1(I[db]) + " can only be chosen if " + I[da] + " is chosen too.", cap1(I[db]) + " requires " + I[da] + "."},
                                  {"Selecting " + I[db] + " is only possible together with " + I[da] + "."});
  std::string lim = c.P({"The total " + sk.wname + " may not exceed " + c.num(W) + " " + sk.wunit + ".", "The limit on total " + sk.wname + " is " + c.num(W) + " " + sk.wunit + "."},
                        {"Capacity: " + c.num(W) + " " + sk.wunit + " of " + sk.wname + " in total."});
  std::string q = " " + c.P({"Each " + sk.item + " is either taken whole or not at all.", "Partial selections are not possible."},
                            {"Every " + sk.item + " is an all-or-nothing choice."}) +
                  " " + c.ask_max("total " + sk.vname) + c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    std::vector<std::vector<std::string>> rows;
    for (int i = 0; i < n; ++i) rows.push_back({I[i], c.num(w[i]), val(v[i])});
    s = (c.tmpl == 3 ? "Selection problem. " : "") + sk.story + " " +
        (c.tmpl == 3 ? "Candidates:" : c.P({"The candidate " + sk.items + " are:", "Options:"}, {""})) + "\n\n" +
        md_table({cap1(sk.item), cap1(sk.wname) + " (" + sk.wunit + ")", cap1(sk.vname)}, rows) + "\n" + lim + rules + q;
  } else {
    s = sk.story + " " + c.P({"There are " + count_word(n) + " candidate " + sk.items + ".", "It can choose among " + count_word(n) + " " + sk.items + "."}, {""});
    for (int i = 0; i < n; ++i)
      s += c.tmpl == 2 ? "\n- " + cap1(I[i]) + ": " + sk.wname + " " + c.num(w[i]) + " " + sk.wunit + ", " + sk.vname + " " + val(v[i])
                       : " " + cap1(I[i]) + " has " + sk.wname + " " + c.num(w[i]) + " " + sk.wunit + " and " + sk.vname + " " + val(v[i]) + ".";
    s += (c.tmpl == 2 ? "\n" : " ") + lim + rules + q;
  }
  Formulation f;
  f.sets = {Formulation::set("I", I, sk.items)};
  f.params = {Formulation::param1("w[i] (" + sk.wname + ")", I, w), Formulation::param1("v[i] (" + sk.vname + ")", I, v), "W = " + lp_num(W)};
  f.vars.push_back("x[i] in {0,1} for i in I: 1 if " + sk.item + " i is selected");
  f.objective = "maximize sum_{i in I} v[i] * x[i]";
  f.constraints.push_back("capacity: sum_{i in I} w[i] * x[i] <= W");
  for (int i : must) f.constraints.push_back("required: x[" + I[i] + "] = 1");
  if (ca >= 0) f.constraints.push_back("conflict: x[" + I[ca] + "] + x[" + I[cb] + "] <= 1");
  if (da >= 0) f.constraints.push_back("dependency: x[" + I[db] + "] <= x[" + I[da] + "]");
  in.formulation = f.render();
}

// ---------------------------------------------------------------------------------------------
void build_facility(GenCtx& c, Instance& in) {
  static const std::vector<std::string> sites = {"Austin", "Boston", "Chicago", "Denver", "Fresno", "Omaha", "Reno", "Tulsa"};
  struct Sk { std::string fac, facs, cust, custs, unit; };
  static const std::vector<Sk> skins = {{"warehouse", "warehouses", "store", "stores", "pallets"},
                                        {"plant", "plants", "region", "regions", "tons"},
                                        {"depot", "depots", "clinic", "clinics", "boxes"}};
  const Sk& sk = c.pick(skins);
  const int nf = c.uni(2, 4), nc = c.uni(3, 6);
  auto F = c.sample(sites, nf);
  std::vector<std::string> C;
  for (int j = 0; j < nc; ++j) C.push_back(cap1(sk.cust) + " " + std::to_string(j + 1));
  std::vector<double> fix(nf), capv(nf), d(nc);
  std::vector<std::vector<double>> cost(nf, std::vector<double>(nc));
  double D = 0;
  for (int j = 0; j < nc; ++j) D += d[j] = c.uni(20, 120);
  for (int i = 0; i < nf; ++i) {
    fix[i] = c.stepped(2000, 30000, 500);
    capv[i] = c.intent == Intent::Infeasible ? std::floor(D * 0.8 / nf * c.unif(0.8, 1.0)) : std::round(D * c.unif(0.4, 0.9));
    for (int j = 0; j < nc; ++j) cost[i][j] = c.uni(2, 20);
  }
  if (c.intent != Intent::Infeasible && std::accumulate(capv.begin(), capv.end(), 0.0) < D) capv[0] = D;
  if (c.intent == Intent::Infeasible) in.reason = "even with every " + sk.fac + " open, total capacity is below the total demand of " + c.num(D) + " " + sk.unit;
  LpModel& m = in.model;
  std::vector<int> y(nf);
  std::vector<std::vector<int>> x(nf, std::vector<int>(nc));
  for (int i = 0; i < nf; ++i) {
    y[i] = m.add_binary("open_" + ident(F[i]));
    m.obj.push_back({y[i], fix[i]});
    in.var_desc.push_back("1 if the " + sk.fac + " in " + F[i] + " is opened");
  }
  for (int i = 0; i < nf; ++i)
    for (int j = 0; j < nc; ++j) {
      x[i][j] = m.add_var("ship_" + ident(F[i]) + "_" + ident(C[j]));
      m.obj.push_back({x[i][j], cost[i][j]});
      in.var_desc.push_back(sk.unit + " shipped from " + F[i] + " to " + C[j]);
    }
  for (int j = 0; j < nc; ++j) {
    Terms t;
    for (int i = 0; i < nf; ++i) t.push_back({x[i][j], 1});
    m.add_row("demand_" + ident(C[j]), t, RowSense::EQ, d[j]);
    in.row_desc.push_back(C[j] + " receives its " + c.num(d[j]) + " " + sk.unit);
  }
  for (int i = 0; i < nf; ++i) {
    Terms t;
    for (int j = 0; j < nc; ++j) t.push_back({x[i][j], 1});
    t.push_back({y[i], -capv[i]});
    m.add_row("cap_" + ident(F[i]), t, RowSense::LE, 0);
    in.row_desc.push_back(F[i] + " ships at most " + c.num(capv[i]) + " " + sk.unit + ", and only if open");
  }
  in.obj_desc = "total cost (fixed plus shipping)";
  std::vector<std::string> head = {"From \\ To"};
  for (auto& cj : C) head.push_back(cj);
  std::vector<std::vector<std::string>> rows;
  for (int i = 0; i < nf; ++i) {
    rows.push_back({F[i]});
    for (int j = 0; j < nc; ++j) rows.back().push_back(c.money(cost[i][j]));
  }
  std::vector<std::string> fs, ds;
  for (int i = 0; i < nf; ++i) fs.push_back(F[i] + " (fixed cost " + c.money(fix[i]) + ", capacity " + c.num(capv[i]) + " " + sk.unit + ")");
  for (int j = 0; j < nc; ++j) ds.push_back(C[j] + " needs " + c.num(d[j]));
  std::string q = " " + c.ask_min("total cost") + c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 3) {
    s = "Network design question: which " + sk.facs + " should we open? Candidates are " + join_and(fs) + ". Demands (" + sk.unit + "): " + join_and(ds) +
        ". Shipping cost per unit:\n\n" + md_table(head, rows) + "\nA closed " + sk.fac + " ships nothing." + q;
  } else {
    s = c.P({"A distributor may open " + sk.facs + " in " + join_and(F) + " to serve " + count_word(nc) + " " + sk.custs + ".",
             "A company is deciding where to open " + sk.facs + "; the candidates are " + join_and(F) + "."},
            {""}) +
        " " + c.P({"Opening a " + sk.fac + " has a fixed cost and the " + sk.fac + " can then ship up to its capacity: ", "Candidate data: "}, {""}) +
        join_and(fs) + ". " + c.P({"Each " + sk.cust + " must receive its full demand: ", "Demands in " + sk.unit + ": "}, {""}) + join_and(ds) + ".";
    if (c.tmpl == 1) {
      s += " Unit shipping costs:\n\n" + md_table(head, rows);
    } else {
      for (int i = 0; i < nf; ++i) {
        std::vector<std::string> parts;
        for (int j = 0; j < nc; ++j) parts.push_back(c.money(cost[i][j]) + " to " + C[j]);
        s += (c.tmpl == 2 ? "\n- " : " ") + std::string("From ") + F[i] + ", shipping one unit costs " + join_and(parts) + ".";
      }
      if (c.tmpl == 2) s += "\n";
    }
    s += c.tmpl == 0 ? q : q.substr(1);
  }
  Formulation f;
  f.sets = {Formulation::set("F", F, "candidate " + sk.facs), Formulation::set("C", C, sk.custs)};
  f.params = {Formulation::param1("f[i] (fixed cost)", F, fix), Formulation::param1("cap[i]", F, capv), Formulation::param1("d[j] (demand)", C, d),
              Formulation::param2("c[i,j] (cost per unit shipped)", F, C, cost)};
  f.vars = {"y[i] in {0,1} for i in F: 1 if site i is opened", "x[i,j] >= 0: units shipped from i to j"};
  f.objective = "minimize sum_{i in F} f[i] * y[i] + sum_{i in F, j in C} c[i,j] * x[i,j]";
  f.constraints = {"demand[j]: sum_{i in F} x[i,j] = d[j] for each j in C",
                   "capacity[i]: sum_{j in C} x[i,j] <= cap[i] * y[i] for each i in F"};
  in.formulation = f.render();
}

// ---------------------------------------------------------------------------------------------
void build_fixed_charge(GenCtx& c, Instance& in) {
  static const std::vector<std::string> prods = {"model A", "model B", "model C", "model D", "deluxe kit", "basic kit", "pro kit"};
  static const std::vector<std::pair<std::string, std::string>> res = {{"machine time", "hours"}, {"labor", "hours"}, {"raw material", "kg"}};
  const int np = c.uni(2, 4), nr = c.uni(1, 2);
  auto P = c.sample(prods, np);
  std::vector<double> p(np), setup(np), dmax(np), b(nr);
  std::vector<std::vector<double>> a(nr, std::vector<double>(np));
  for (int j = 0; j < np; ++j) p[j] = c.uni(10, 80), setup[j] = c.stepped(100, 2000, 50), dmax[j] = c.uni(20, 150);
  for (int i = 0; i < nr; ++i) {
    double need = 0;
    for (int j = 0; j < np; ++j) need += dmax[j] * (a[i][j] = c.uni(1, 6));
    b[i] = std::round(need * c.unif(0.3, 0.6));
  }
  const bool integer = c.coin(0.5);
  const int kmax = np > 2 && c.coin(0.3) ? c.uni(1, np - 1) : -1;
  double tmin = -1;
  if (c.intent == Intent::Infeasible) {
    tmin = std::accumulate(dmax.begin(), dmax.end(), 0.0) + c.uni(5, 50);
    in.reason = "the required total output of " + c.num(tmin) + " units exceeds what can be sold";
  }
  LpModel& m = in.model;
  m.maximize = true;
  std::vector<int> x(np), y(np);
  for (int j = 0; j < np; ++j) {
    x[j] = m.add_var("x_" + ident(P[j]), 0, kLpInf, integer);
    m.obj.push_back({x[j], p[j]});
    in.var_desc.push_back("units of " + P[j] + " produced");
  }
  for (int j = 0; j < np; ++j) {
    y[j] = m.add_binary("setup_" + ident(P[j]));
    m.obj.push_back({y[j], -setup[j]});
    in.var_desc.push_back("1 if the " + P[j] + " line is set up");
  }
  for (int i = 0; i < nr; ++i) {
    Terms t;
    for (int j = 0; j < np; ++j) t.push_back({x[j], a[i][j]});
    m.add_row("res_" + ident(res[i].first), t, RowSense::LE, b[i]);
    in.row_desc.push_back(res[i].first + " limit of " + c.num(b[i]) + " " + res[i].second);
  }
  for (int j = 0; j < np; ++j) {
    m.add_row("link_" + ident(P[j]), {{x[j], 1}, {y[j], -dmax[j]}}, RowSense::LE, 0);
    in.row_desc.push_back(P[j] + " only if set up, at most " + c.num(dmax[j]) + " units");
  }
  Terms ys, xs;
  for (int j = 0; j < np; ++j) ys.push_back({y[j], 1}), xs.push_back({x[j], 1});
  if (kmax > 0) m.add_row("max_lines", ys, RowSense::LE, kmax), in.row_desc.push_back("at most " + c.num(kmax) + " lines set up");
  if (tmin > 0) m.add_row("min_output", xs, RowSense::GE, tmin), in.row_desc.push_back("total output at least " + c.num(tmin));
  in.obj_desc = "net profit (contribution minus setup costs)";

  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"Product", "Profit per unit", "Setup cost", "Max sales"};
  for (int i = 0; i < nr; ++i) head.push_back(cap1(res[i].first) + " per unit");
  for (int j = 0; j < np; ++j) {
    rows.push_back({P[j], c.money(p[j]), c.money(setup[j]), c.num(dmax[j])});
    for (int i = 0; i < nr; ++i) rows.back().push_back(c.num(a[i][j]));
  }
  std::vector<std::string> avail;
  for (int i = 0; i < nr; ++i) avail.push_back(c.num(b[i]) + " " + res[i].second + " of " + res[i].first);
  std::string extra = (kmax > 0 ? " " + c.P({"At most " + c.num(kmax) + " product lines can be set up.", "Only " + c.num(kmax) + " lines may be run."}, {"No more than " + c.num(kmax) + " setups are possible."}) : "") +
                      (tmin > 0 ? " " + c.P({"Total output must be at least " + c.num(tmin) + " units."}, {"A delivery contract demands " + c.num(tmin) + " units in total."}) : "") +
                      " " + (integer ? c.P({"Only whole units can be made.", "Production quantities must be integers."}, {"Quantities are whole numbers."})
                                     : c.P({"Quantities may be fractional."}, {"Fractional amounts are allowed."}));
  std::string q = " " + c.ask_max("net profit") + c.maybe_infeasible_note();
  std::string setup_s = c.P({"Producing any amount of a product requires a one-time setup cost.", "A product line incurs a setup cost if it is used at all."},
                            {"Each line used pays its setup charge once."});
  std::string& s = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    s = (c.tmpl == 3 ? "Planning note: choose which products to launch this season and how many units of each. " : c.P({"A manufacturer can make " + join_and(P) + ". ", "A workshop considers producing " + join_and(P) + ". "}, {""})) +
        setup_s + "\n\n" + md_table(head, rows) + "\n" + cap1(join_and(avail)) + " are available." + extra + q;
  } else {
    s = c.P({"A manufacturer can make " + join_and(P) + ".", "A workshop considers producing " + join_and(P) + "."}, {""}) + " " + setup_s;
    for (int j = 0; j < np; ++j) {
      std::vector<std::string> parts;
      for (int i = 0; i < nr; ++i) parts.push_back(c.num(a[i][j]) + " " + res[i].second + " of " + res[i].first);
      s += (c.tmpl == 2 ? "\n- " : " ") + cap1(P[j]) + ": profit " + c.money(p[j]) + " per unit, setup cost " + c.money(setup[j]) + ", at most " +
           c.num(dmax[j]) + " units can be sold, uses " + join_and(parts) + " per unit" + (c.tmpl == 2 ? "" : ".");
    }
    s += (c.tmpl == 2 ? "\n" : " ") + cap1(join_and(avail)) + " are available." + extra + q;
  }
  Formulation f;
  std::vector<std::string> Rn;
  for (int i = 0; i < nr; ++i) Rn.push_back(res[i].first);
  f.sets = {Formulation::set("P", P, "products"), Formulation::set("R", Rn, "resources")};
  f.params = {Formulation::param1("p[j] (profit per unit)", P, p), Formulation::param1("s[j] (setup cost)", P, setup),
              Formulation::param1("M[j] (maximum sales)", P, dmax), Formulation::param2("a[r,j] (use per unit)", Rn, P, a),
              Formulation::param1("b[r] (available)", Rn, b)};
  f.vars = {std::string("x[j] >= 0") + (integer ? " integer" : "") + ": units of product j", "y[j] in {0,1}: 1 if product j is set up"};
  f.objective = "maximize sum_{j in P} (p[j] * x[j] - s[j] * y[j])";
  f.constraints = {"resource[r]: sum_{j in P} a[r,j] * x[j] <= b[r] for each r in R", "link[j]: x[j] <= M[j] * y[j] for each j in P"};
  if (kmax > 0) f.constraints.push_back("lines: sum_{j in P} y[j] <= " + c.num(kmax));
  if (tmin > 0) f.constraints.push_back("output: sum_{j in P} x[j] >= " + c.num(tmin));
  in.formulation = f.render();
}

// ---------------------------------------------------------------------------------------------
void build_lot_sizing(GenCtx& c, Instance& in) {
  static const std::vector<std::string> per = {"week", "month", "quarter"};
  static const std::vector<std::string> goods = {"pumps", "bicycles", "printers", "valves", "engines"};
  const std::string pd = c.pick(per), g = c.pick(goods);
  const int T = c.uni(3, 6);
  std::vector<double> d(T), pc(T);
  for (int t = 0; t < T; ++t) d[t] = c.uni(20, 150);
  const bool flat = c.coin(0.5);
  const double base = c.uni(5, 15);
  for (int t = 0; t < T; ++t) pc[t] = flat ? base : c.uni(5, 15);
  double C = std::ceil(*std::max_element(d.begin(), d.end()) * c.unif(1.1, 2.0));
  const double S = c.stepped(100, 800, 10), h = c.stepped(0.5, 3, 0.5);
  if (c.intent == Intent::Infeasible) {
    d[0] = C + c.uni(5, 30);
    in.reason = "the first " + pd + "'s demand of " + c.num(d[0]) + " exceeds the capacity of " + c.num(C) + " and there is no starting stock";
  }
  std::vector<std::string> Tn;
  for (int t = 0; t < T; ++t) Tn.push_back(std::to_string(t + 1));
  LpModel& m = in.model;
  std::vector<int> x(T), y(T), s(T);
  for (int t = 0; t < T; ++t) {
    x[t] = m.add_var("make_" + Tn[t]);
    y[t] = m.add_binary("setup_" + Tn[t]);
    s[t] = m.add_var("inv_" + Tn[t]);
    m.obj.push_back({x[t], pc[t]});
    m.obj.push_back({y[t], S});
    m.obj.push_back({s[t], h});
    in.var_desc.push_back(g + " produced in " + pd + " " + Tn[t]);
    in.var_desc.push_back("1 if production is set up in " + pd + " " + Tn[t]);
    in.var_desc.push_back(g + " in stock at the end of " + pd + " " + Tn[t]);
  }
  for (int t = 0; t < T; ++t) {
    Terms bal = {{x[t], 1}, {s[t], -1}};
    if (t > 0) bal.insert(bal.begin(), {s[t - 1], 1});
    m.add_row("balance_" + Tn[t], bal, RowSense::EQ, d[t]);
    in.row_desc.push_back("demand of " + c.num(d[t]) + " met in " + pd + " " + Tn[t]);
  }
  for (int t = 0; t < T; ++t) {
    m.add_row("setup_link_" + Tn[t], {{x[t], 1}, {y[t], -C}}, RowSense::LE, 0);
    in.row_desc.push_back("production only after a setup, at most " + c.num(C));
  }
  in.obj_desc = "total production, setup and holding cost";
  std::vector<std::string> ds;
  for (int t = 0; t < T; ++t) ds.push_back(c.num(d[t]));
  std::vector<std::vector<std::string>> rows;
  for (int t = 0; t < T; ++t) rows.push_back({cap1(pd) + " " + Tn[t], c.num(d[t]), c.money(pc[t])});
  std::string cost_s = flat ? c.P({"Each unit costs " + c.money(base) + " to make.", "The variable cost is " + c.money(base) + " per unit."}, {"Unit cost: " + c.money(base) + "."}) : "";
  if (!flat) {
    std::vector<std::string> ps;
    for (int t = 0; t < T; ++t) ps.push_back(c.money(pc[t]) + " in " + pd + " " + Tn[t]);
    cost_s = "The unit production cost is " + join_and(ps) + ".";
  }
  std::string rules = c.P({"In any " + pd + " with production, a setup costing " + c.money(S) + " is paid.", "Every " + pd + " in which the line runs incurs a setup cost of " + c.money(S) + "."},
                          {"Running the line in a " + pd + " triggers a " + c.money(S) + " setup charge."}) +
                      " " + c.P({"At most " + c.num(C) + " " + g + " can be made per " + pd + ".", "Capacity is " + c.num(C) + " units per " + pd + "."}, {"The line's limit is " + c.num(C) + " units each " + pd + "."}) +
                      " " + c.P({"Holding a unit in stock from one " + pd + " to the next costs " + c.money(h) + ".", "Inventory costs " + c.money(h) + " per unit per " + pd + "."},
                                {"Carrying stock costs " + c.money(h) + " per unit per " + pd + "."}) +
                      " " + c.P({"There is no initial inventory and demand cannot be backlogged.", "Stock starts at zero; every " + pd + "'s demand must be met on time."},
                                {"Nothing is in stock at the start, and late delivery is not permitted."});
  std::string q = " " + c.ask_min("total cost") + c.maybe_infeasible_note();
  std::string& st = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    st = (c.tmpl == 3 ? "Scheduling request for the " + g + " line over the next " + count_word(T) + " " + pd + "s:" : "A factory plans production of " + g + " for " + count_word(T) + " " + pd + "s.") +
         "\n\n" + md_table({cap1(pd), "Demand", "Unit cost"}, rows) + "\n" + rules + q;
  } else {
    st = c.P({"A factory must meet demand for " + g + " over the next " + count_word(T) + " " + pd + "s.", "Demand for " + g + " over " + count_word(T) + " " + pd + "s must be satisfied."}, {""}) +
         (c.tmpl == 2 ? "\n- Demand per " + pd + ": " + join_and(ds) + "\n- " + cost_s + "\n" : " Demands are " + join_and(ds) + " units. " + cost_s + " ") + rules + q;
  }
  Formulation f;
  f.sets = {Formulation::set("T", Tn, pd + "s")};
  f.params = {Formulation::param1("d[t] (demand)", Tn, d), Formulation::param1("c[t] (unit cost)", Tn, pc), "S = " + lp_num(S) + " (setup cost)",
              "h = " + lp_num(h) + " (holding cost per unit per " + pd + ")", "C = " + lp_num(C) + " (capacity per " + pd + ")"};
  f.vars = {"x[t] >= 0: units produced in t", "y[t] in {0,1}: 1 if a setup happens in t", "s[t] >= 0: stock at the end of t (s[0] = 0)"};
  f.objective = "minimize sum_{t in T} (c[t] * x[t] + S * y[t] + h * s[t])";
  f.constraints = {"balance[t]: s[t-1] + x[t] - s[t] = d[t] for each t in T", "setup[t]: x[t] <= C * y[t] for each t in T"};
  in.formulation = f.render();
}

}  // namespace

void add_ip_families(std::vector<Family>& out) {
  out.push_back({"ip", "knapsack", 3, 1, true, false, build_knapsack});
  out.push_back({"ip", "facility_location", 3, 1, true, false, build_facility});
  out.push_back({"ip", "fixed_charge", 3, 1, true, false, build_fixed_charge});
  out.push_back({"ip", "lot_sizing", 3, 1, true, false, build_lot_sizing});
}

}  // namespace trex::orx
