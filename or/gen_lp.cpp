// Category "lp": continuous linear programs. Families: production planning, blending, diet,
// portfolio-style allocation. Templates t0 (prose), t1 (table), t2 (bullets) are train-only;
// t3 (memo with transposed table) is test-only.
#include <algorithm>
#include <cmath>
#include "or/generator.h"
#include "or/lp_writer.h"

namespace trex::orx {

namespace {

struct Res {
  std::string name, unit;  // "carpentry", "hours"
};
struct ProdSkin {
  std::string biz;
  std::vector<std::string> products;
  std::string unit, units, period;
  std::vector<Res> res;
};

const std::vector<ProdSkin>& prod_skins() {
  static const std::vector<ProdSkin> s = {
      {"furniture workshop", {"tables", "chairs", "desks", "bookcases", "cabinets"}, "unit", "units", "week",
       {{"carpentry", "hours"}, {"finishing", "hours"}, {"lumber", "board feet"}, {"packaging", "hours"}}},
      {"chemical plant", {"Alkyd", "Bexol", "Cetane", "Duron", "Esterol"}, "ton", "tons", "week",
       {{"reactor time", "hours"}, {"distillation", "hours"}, {"feedstock", "tons"}, {"catalyst", "kg"}}},
      {"snack factory", {"granola", "muesli", "oat bars", "trail mix", "crackers"}, "batch", "batches", "day",
       {{"mixing", "hours"}, {"baking", "hours"}, {"oats", "kg"}, {"packing", "hours"}}},
      {"electronics plant", {"routers", "modems", "switches", "hubs", "repeaters"}, "lot", "lots", "month",
       {{"assembly", "hours"}, {"testing", "hours"}, {"circuit boards", "boards"}, {"soldering", "hours"}}},
  };
  return s;
}

std::string periodly(const std::string& p) { return p == "day" ? "daily" : p + "ly"; }

std::string var_prefix(GenCtx& c, std::initializer_list<std::string> opts) { return c.pick(opts); }

void build_production(GenCtx& c, Instance& in) {
  const ProdSkin& sk = c.pick(prod_skins());
  const int np = c.uni(2, 4), nr = c.uni(2, 3);
  std::vector<std::string> P = c.sample(sk.products, np + 1);
  std::string extra = P.back();
  P.pop_back();
  std::vector<int> ridx = {0, 1, 2, 3};
  c.shuffle(ridx);
  std::vector<Res> R;
  for (int i = 0; i < nr; ++i) R.push_back(sk.res[ridx[i]]);
  std::vector<double> profit(np), cap(np, -1), mn(np, -1), avail(nr);
  std::vector<std::vector<double>> use(nr, std::vector<double>(np));
  for (int j = 0; j < np; ++j) profit[j] = c.coin(0.3) ? c.stepped(5, 60, 0.5) : c.uni(5, 60);
  for (int i = 0; i < nr; ++i)
    for (int j = 0; j < np; ++j) use[i][j] = c.coin(0.2) ? 0 : c.stepped(0.5, 6, 0.5);
  for (int j = 0; j < np; ++j)  // every product uses something
    if (std::all_of(use.begin(), use.end(), [&](auto& r) { return r[j] == 0; })) use[c.uni(0, nr - 1)][j] = c.uni(1, 4);
  for (int i = 0; i < nr; ++i) {
    if (std::all_of(use[i].begin(), use[i].end(), [](double v) { return v == 0; })) use[i][c.uni(0, np - 1)] = c.uni(1, 4);
    double need = 0;
    for (int j = 0; j < np; ++j) need += use[i][j] * c.uni(5, 40);
    avail[i] = std::max(1.0, std::round(need * c.unif(0.5, 0.8)));
  }
  for (int j = 0; j < np; ++j)
    if (c.coin(0.35)) cap[j] = c.uni(3, 30);
  if (c.intent == Intent::Infeasible) {
    const int i = c.uni(0, nr - 1);
    int users = 0;
    for (int j = 0; j < np; ++j) users += use[i][j] > 0;
    for (int j = 0; j < np; ++j)
      if (use[i][j] > 0) {
        mn[j] = std::ceil(avail[i] * 1.3 / (users * use[i][j]));
        cap[j] = -1;
      }
    in.reason = "the contracted minimum quantities alone need more " + R[i].name + " than the " + c.num(avail[i]) + " " +
                R[i].unit + " available";
  } else {
    for (int j = 0; j < np; ++j)
      if (c.coin(0.15)) mn[j] = c.uni(1, 3);
  }
  const bool unb = c.intent == Intent::Unbounded;
  double extra_profit = c.uni(5, 40);
  if (unb) in.reason = extra + " earns a profit but uses no limited resource and has no sales limit";

  // Model.
  LpModel& m = in.model;
  m.maximize = true;
  const std::string pre = var_prefix(c, {"x_", "make_", "prod_", "q_"});
  std::vector<int> x(np);
  for (int j = 0; j < np; ++j) {
    x[j] = m.add_var(pre + ident(P[j]), mn[j] > 0 ? mn[j] : 0, cap[j] > 0 ? cap[j] : kLpInf);
    m.obj.push_back({x[j], profit[j]});
    in.var_desc.push_back(sk.units + " of " + P[j] + " made per " + sk.period);
  }
  if (unb) {
    int xe = m.add_var(pre + ident(extra));
    m.obj.push_back({xe, extra_profit});
    in.var_desc.push_back(sk.units + " of " + extra + " sold per " + sk.period);
  }
  for (int i = 0; i < nr; ++i) {
    Terms t;
    for (int j = 0; j < np; ++j)
      if (use[i][j] != 0) t.push_back({x[j], use[i][j]});
    m.add_row("cap_" + ident(R[i].name), t, RowSense::LE, avail[i]);
    in.row_desc.push_back(R[i].name + " available (" + c.num(avail[i]) + " " + R[i].unit + ")");
  }
  in.obj_desc = "total profit per " + sk.period;

  // Statement.
  std::vector<std::string> prof_s, cap_s, min_s, avail_s;
  for (int j = 0; j < np; ++j) prof_s.push_back(P[j] + " " + c.money(profit[j]));
  for (int j = 0; j < np; ++j)
    if (cap[j] > 0) cap_s.push_back(c.P({"at most " + c.num(cap[j]) + " " + sk.units + " of " + P[j] + " can be sold",
                                          "demand for " + P[j] + " is limited to " + c.num(cap[j]) + " " + sk.units},
                                         {"the market absorbs no more than " + c.num(cap[j]) + " " + sk.units + " of " + P[j]}));
  for (int j = 0; j < np; ++j)
    if (mn[j] > 0) min_s.push_back(c.P({"at least " + c.num(mn[j]) + " " + sk.units + " of " + P[j] + " must be produced",
                                         "a contract requires at least " + c.num(mn[j]) + " " + sk.units + " of " + P[j]},
                                        {"a standing order commits the firm to a minimum of " + c.num(mn[j]) + " " + sk.units + " of " + P[j]}));
  for (int i = 0; i < nr; ++i) avail_s.push_back(c.num(avail[i]) + " " + R[i].unit + " of " + R[i].name);
  auto usage_sentence = [&](int j) {
    std::vector<std::string> parts;
    for (int i = 0; i < nr; ++i)
      if (use[i][j] != 0) parts.push_back(c.num(use[i][j]) + " " + R[i].unit + " of " + R[i].name);
    return c.P({"Each " + sk.unit + " of " + P[j] + " requires " + join_and(parts) + ".",
                "Making one " + sk.unit + " of " + P[j] + " uses " + join_and(parts) + "."},
               {"A single " + sk.unit + " of " + P[j] + " consumes " + join_and(parts) + "."});
  };
  std::string extra_s = unb ? " " + cap1(extra) + " is bought ready-made from a partner: it needs none of the resources above, earns " +
                                  c.money(extra_profit) + " per " + sk.unit + ", and any quantity can be sold."
                            : "";
  std::string frac = " " + c.P({"Fractional quantities are allowed.", "Quantities may be fractional."},
                               {"Non-integer production amounts are acceptable."});
  std::string limits;
  if (!cap_s.empty()) limits += " " + cap1(join_and(cap_s)) + ".";
  if (!min_s.empty()) limits += " " + cap1(join_and(min_s)) + ".";
  std::string q = " " + c.ask_max("total profit per " + sk.period) + c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 0) {
    s = cap1(a_an(sk.biz)) + " " + c.pick({"produces", "makes", "manufactures"}) + " " + join_and(P) + ". " +
        c.P({"The profit per " + sk.unit + " is: ", "Each " + sk.unit + " sold earns a profit of: "}, {"Unit margins are: "}) +
        join_and(prof_s) + ".";
    for (int j = 0; j < np; ++j) s += " " + usage_sentence(j);
    s += " " + c.P({"Each " + sk.period + " the plant has ", "Per " + sk.period + " there are "}, {"Capacity per " + sk.period + ": "}) +
         join_and(avail_s) + " available." + limits + extra_s + frac + q;
  } else if (c.tmpl == 1 || c.tmpl == 3) {
    std::vector<std::string> head;
    std::vector<std::vector<std::string>> rows;
    if (c.tmpl == 1) {
      head = {"Product"};
      for (auto& r : R) head.push_back(cap1(r.name) + " (" + r.unit + " per " + sk.unit + ")");
      head.push_back("Profit per " + sk.unit);
      for (int j = 0; j < np; ++j) {
        rows.push_back({P[j]});
        for (int i = 0; i < nr; ++i) rows.back().push_back(c.num(use[i][j]));
        rows.back().push_back(c.money(profit[j]));
      }
      s = c.P({cap1(a_an(sk.biz)) + " must plan its " + periodly(sk.period) + " output of " + join_and(P) + ".",
               "The planner of " + a_an(sk.biz) + " decides how much of " + join_and(P) + " to make each " + sk.period + "."},
              {""}) +
          " " + c.P({"Resource use and profit are:", "The data:"}, {""}) + "\n\n" + md_table(head, rows) + "\n" +
          cap1(join_and(avail_s)) + " are available per " + sk.period + "." + limits + extra_s + frac + q;
    } else {
      head = {"Resource"};
      for (auto& p : P) head.push_back(cap1(p));
      head.push_back("Available");
      for (int i = 0; i < nr; ++i) {
        rows.push_back({cap1(R[i].name) + " (" + R[i].unit + ")"});
        for (int j = 0; j < np; ++j) rows.back().push_back(c.num(use[i][j]));
        rows.back().push_back(c.num(avail[i]));
      }
      s = "Memo: management of our " + sk.biz + " asks for the most profitable " + periodly(sk.period) + " mix of " + join_and(P) +
          ". Requirements per " + sk.unit + " (columns) against the " + periodly(sk.period) + " supply (last column):\n\n" +
          md_table(head, rows) + "\nMargins per " + sk.unit + ": " + join_and(prof_s) + "." + limits + extra_s + frac + q;
    }
  } else {
    s = "Production data for " + a_an(sk.biz) + " (per " + sk.period + "):\n";
    for (int j = 0; j < np; ++j) {
      std::vector<std::string> parts;
      for (int i = 0; i < nr; ++i) parts.push_back(c.num(use[i][j]) + " " + R[i].unit + " " + R[i].name);
      s += "- " + cap1(P[j]) + ": profit " + c.money(profit[j]) + " per " + sk.unit + "; needs " + join_and(parts) + "\n";
    }
    for (int i = 0; i < nr; ++i) s += "- " + cap1(R[i].name) + " available: " + c.num(avail[i]) + " " + R[i].unit + "\n";
    s += cap1(limits.empty() ? "" : limits.substr(1)) + extra_s + frac + q;
  }

  // Formulation.
  Formulation f;
  std::vector<std::string> Pk = P, Rk;
  if (unb) Pk.push_back(extra);
  for (auto& r : R) Rk.push_back(r.name);
  f.sets = {Formulation::set("P", Pk, "products"), Formulation::set("R", Rk, "limited resources")};
  std::vector<double> pr = profit;
  if (unb) pr.push_back(extra_profit);
  f.params.push_back(Formulation::param1("profit[p] (per " + sk.unit + ")", Pk, pr));
  std::vector<std::vector<double>> u2 = use;
  if (unb)
    for (auto& r : u2) r.push_back(0);
  f.params.push_back(Formulation::param2("use[r,p] (resource per " + sk.unit + ")", Rk, Pk, u2));
  f.params.push_back(Formulation::param1("avail[r]", Rk, avail));
  f.vars.push_back("x[p] >= 0 for p in P: " + sk.units + " of product p per " + sk.period + " (continuous)");
  f.objective = "maximize sum_{p in P} profit[p] * x[p]";
  f.constraints.push_back("resource[r]: sum_{p in P} use[r,p] * x[p] <= avail[r] for each r in R");
  for (int j = 0; j < np; ++j) {
    if (cap[j] > 0) f.constraints.push_back("demand: x[" + P[j] + "] <= " + c.num(cap[j]));
    if (mn[j] > 0) f.constraints.push_back("commitment: x[" + P[j] + "] >= " + c.num(mn[j]));
  }
  in.formulation = f.render();
}

// ---------------------------------------------------------------------------------------------
struct BlendSkin {
  std::string product, unit;
  std::vector<std::string> ingredients, props;
  double cost_lo, cost_hi, cost_step;
};
const std::vector<BlendSkin>& blend_skins() {
  static const std::vector<BlendSkin> s = {
      {"cattle feed", "kg", {"corn", "soybean meal", "fish meal", "barley", "oats", "alfalfa"}, {"protein", "fat", "fiber", "calcium"}, 0.1, 1.5, 0.01},
      {"stainless alloy", "ton", {"ore A", "ore B", "scrap steel", "nickel pellets", "chrome alloy", "pig iron"}, {"chromium", "nickel", "carbon", "manganese"}, 200, 2000, 10},
      {"garden fertilizer", "kg", {"ammonium nitrate", "superphosphate", "potash", "compost", "bone meal"}, {"nitrogen", "phosphate", "potassium"}, 0.2, 2.0, 0.05},
      {"pet food", "kg", {"chicken meal", "rice", "beet pulp", "salmon oil", "pea protein", "wheat"}, {"protein", "fat", "fiber"}, 0.3, 3.0, 0.05},
  };
  return s;
}

void build_blending(GenCtx& c, Instance& in) {
  const BlendSkin& sk = c.pick(blend_skins());
  const int ni = c.uni(3, std::min(5, (int)sk.ingredients.size())), nk = c.uni(2, std::min(3, (int)sk.props.size()));
  auto I = c.sample(sk.ingredients, ni), K = c.sample(sk.props, nk);
  std::vector<double> cost(ni), w(ni);
  std::vector<std::vector<double>> q(ni, std::vector<double>(nk));
  double wsum = 0;
  for (int i = 0; i < ni; ++i) {
    cost[i] = c.stepped(sk.cost_lo, sk.cost_hi, sk.cost_step);
    w[i] = c.unif(0.05, 1);
    wsum += w[i];
    for (int k = 0; k < nk; ++k) q[i][k] = c.coin(0.15) ? 0 : c.uni(1, 45);
  }
  for (auto& v : w) v /= wsum;
  std::vector<int> kind(nk);  // +1: minimum, -1: maximum
  std::vector<double> lim(nk);
  for (int k = 0; k < nk; ++k) {
    double content = 0, qmax = 0;
    for (int i = 0; i < ni; ++i) content += q[i][k] * w[i], qmax = std::max(qmax, q[i][k]);
    kind[k] = c.coin(0.65) ? 1 : -1;
    lim[k] = kind[k] > 0 ? std::max(1.0, std::floor(content * c.unif(0.8, 0.97))) : std::ceil(content * c.unif(1.03, 1.3));
  }
  if (c.intent == Intent::Infeasible) {
    const int k = c.uni(0, nk - 1);
    double qmax = 0;
    for (int i = 0; i < ni; ++i) qmax = std::max(qmax, q[i][k]);
    kind[k] = 1;
    lim[k] = qmax + c.uni(1, 5);
    in.reason = "no ingredient contains " + c.num(lim[k]) + "% " + K[k] + ", so no mixture can reach that share";
  }
  int capped = -1;
  double cap_pct = 0;
  if (c.coin(0.5)) {
    capped = c.uni(0, ni - 1);
    cap_pct = std::min(95.0, std::ceil(100 * w[capped]) + c.uni(0, 10));
  }
  LpModel& m = in.model;
  const std::string pre = c.pick({"x_", "frac_", "share_", "w_"});
  std::vector<int> x(ni);
  for (int i = 0; i < ni; ++i) {
    x[i] = m.add_var(pre + ident(I[i]), 0, i == capped ? cap_pct / 100 : kLpInf);
    m.obj.push_back({x[i], cost[i]});
    in.var_desc.push_back("share of " + I[i] + " per " + sk.unit + " of " + sk.product);
  }
  Terms all;
  for (int i = 0; i < ni; ++i) all.push_back({x[i], 1});
  m.add_row("mix", all, RowSense::EQ, 1);
  in.row_desc.push_back("the shares add up to one " + sk.unit);
  for (int k = 0; k < nk; ++k) {
    Terms t;
    for (int i = 0; i < ni; ++i)
      if (q[i][k] != 0) t.push_back({x[i], q[i][k]});
    if (t.empty()) t.push_back({x[0], 0});
    m.add_row((kind[k] > 0 ? "min_" : "max_") + ident(K[k]), t, kind[k] > 0 ? RowSense::GE : RowSense::LE, lim[k]);
    in.row_desc.push_back(K[k] + (kind[k] > 0 ? " at least " : " at most ") + c.num(lim[k]) + "%");
  }
  in.obj_desc = "cost per " + sk.unit + " of " + sk.product;

  std::vector<std::string> req;
  for (int k = 0; k < nk; ++k) req.push_back((kind[k] > 0 ? "at least " : "at most ") + c.pct(lim[k]) + " " + K[k]);
  std::string cap_s = capped >= 0 ? " " + c.P({"At most " + c.pct(cap_pct) + " of the mix may be " + I[capped] + ".",
                                                "No more than " + c.pct(cap_pct) + " of the blend can come from " + I[capped] + "."},
                                               {"The share of " + I[capped] + " is capped at " + c.pct(cap_pct) + "."})
                                  : "";
  std::string q_s = " " + c.ask_min("cost per " + sk.unit + " of " + sk.product) + c.maybe_infeasible_note();
  std::vector<std::string> head = {"Ingredient", "Cost per " + sk.unit};
  for (auto& k : K) head.push_back(cap1(k) + " (%)");
  std::vector<std::vector<std::string>> rows;
  for (int i = 0; i < ni; ++i) {
    rows.push_back({I[i], c.money(cost[i])});
    for (int k = 0; k < nk; ++k) rows.back().push_back(c.num(q[i][k]));
  }
  std::string& s = in.statement;
  if (c.tmpl == 0 || c.tmpl == 2) {
    s = c.P({"A producer blends " + sk.product + " from " + join_and(I) + ".", "A mill mixes " + join_and(I) + " to make " + sk.product + "."},
            {"Our plant prepares " + sk.product + " by combining " + join_and(I) + "."});
    for (int i = 0; i < ni; ++i) {
      std::vector<std::string> parts;
      for (int k = 0; k < nk; ++k) parts.push_back(c.pct(q[i][k]) + " " + K[k]);
      if (c.tmpl == 0) s += " " + cap1(I[i]) + " costs " + c.money(cost[i]) + " per " + sk.unit + " and contains " + join_and(parts) + ".";
      else s += "\n- " + cap1(I[i]) + ": " + c.money(cost[i]) + " per " + sk.unit + "; " + join_and(parts);
    }
    s += (c.tmpl == 2 ? "\n" : " ") + c.P({"The final product must contain ", "Quality rules require "}, {"Specifications: "}) +
         join_and(req) + " (by weight)." + cap_s + " " + c.P({"Contents mix linearly.", "Shares are by weight and contents blend linearly."}, {"Assume linear blending."}) + q_s;
  } else {
    s = (c.tmpl == 1 ? c.P({"A " + sk.product + " recipe is to be chosen from the ingredients below (contents in percent by weight).",
                             "The following ingredients are available for " + sk.product + ":"},
                            {""})
                     : "Request from the quality department: find the cheapest recipe for " + sk.product + ". Ingredient data:") +
        "\n\n" + md_table(head, rows) + "\nThe blend must have " + join_and(req) + "." + cap_s + q_s;
  }
  Formulation f;
  f.sets = {Formulation::set("I", I, "ingredients"), Formulation::set("K", K, "properties")};
  f.params.push_back(Formulation::param1("cost[i] (per " + sk.unit + ")", I, cost));
  std::vector<std::vector<double>> qt(nk, std::vector<double>(ni));
  for (int i = 0; i < ni; ++i)
    for (int k = 0; k < nk; ++k) qt[k][i] = q[i][k];
  f.params.push_back(Formulation::param2("content[k,i] (percent)", K, I, qt));
  f.vars.push_back("x[i] >= 0 for i in I: fraction of ingredient i in one " + sk.unit + " of blend");
  f.objective = "minimize sum_{i in I} cost[i] * x[i]";
  f.constraints.push_back("mix: sum_{i in I} x[i] = 1");
  for (int k = 0; k < nk; ++k)
    f.constraints.push_back(K[k] + ": sum_{i in I} content[" + K[k] + ",i] * x[i] " + (kind[k] > 0 ? ">= " : "<= ") + c.num(lim[k]));
  if (capped >= 0) f.constraints.push_back("limit: x[" + I[capped] + "] <= " + lp_num(cap_pct / 100));
  in.formulation = f.render();
}

// ---------------------------------------------------------------------------------------------
struct Nutrient {
  std::string name, unit;
  int lo, hi;  // per-serving range
};

void build_diet(GenCtx& c, Instance& in) {
  static const std::vector<std::string> foods = {"oatmeal", "milk", "eggs", "bread", "peanut butter", "apples",
                                                 "chicken", "rice", "beans", "yogurt", "spinach", "cheese"};
  static const std::vector<Nutrient> nuts = {{"calories", "kcal", 50, 400}, {"protein", "g", 1, 30}, {"calcium", "mg", 10, 300},
                                             {"iron", "mg", 1, 8}, {"vitamin C", "mg", 0, 60}, {"fiber", "g", 0, 10}};
  const int nf = c.uni(3, 6), nn = c.uni(2, 4);
  auto F = c.sample(foods, nf);
  std::vector<int> nidx = {0, 1, 2, 3, 4, 5};
  c.shuffle(nidx);
  std::vector<Nutrient> N;
  for (int k = 0; k < nn; ++k) N.push_back(nuts[nidx[k]]);
  std::vector<double> cost(nf), serv(nf), ub(nf, -1), req(nn);
  std::vector<std::vector<double>> a(nn, std::vector<double>(nf));
  for (int f = 0; f < nf; ++f) {
    cost[f] = c.stepped(0.15, 3.0, 0.05);
    serv[f] = c.stepped(0, 3, 0.5);
    if (c.coin(0.4)) ub[f] = std::ceil(serv[f]) + c.uni(1, 2);
  }
  for (int k = 0; k < nn; ++k) {
    double tot = 0;
    for (int f = 0; f < nf; ++f) tot += serv[f] * (a[k][f] = c.uni(N[k].lo, N[k].hi));
    req[k] = std::max(1.0, std::floor(tot * c.unif(0.6, 0.95)));
  }
  if (c.intent == Intent::Infeasible) {
    const int k = c.uni(0, nn - 1);
    double most = 0;
    for (int f = 0; f < nf; ++f) most += a[k][f] * (ub[f] = c.uni(1, 3));
    req[k] = std::ceil(most * c.unif(1.1, 1.4)) + 1;
    in.reason = "even the largest allowed servings of every food supply less than " + c.num(req[k]) + " " + N[k].unit + " of " + N[k].name;
  }
  LpModel& m = in.model;
  const std::string pre = c.pick({"x_", "serv_", "n_"});
  std::vector<int> x(nf);
  for (int f = 0; f < nf; ++f) {
    x[f] = m.add_var(pre + ident(F[f]), 0, ub[f] > 0 ? ub[f] : kLpInf);
    m.obj.push_back({x[f], cost[f]});
    in.var_desc.push_back("servings of " + F[f] + " per day");
  }
  for (int k = 0; k < nn; ++k) {
    Terms t;
    for (int f = 0; f < nf; ++f)
      if (a[k][f] != 0) t.push_back({x[f], a[k][f]});
    if (t.empty()) t.push_back({x[0], 0});
    m.add_row("need_" + ident(N[k].name), t, RowSense::GE, req[k]);
    in.row_desc.push_back("at least " + c.num(req[k]) + " " + N[k].unit + " of " + N[k].name);
  }
  in.obj_desc = "daily food cost";
  std::vector<std::string> head = {"Food", "Cost per serving"}, reqs, lims;
  for (auto& n : N) head.push_back(cap1(n.name) + " (" + n.unit + ")");
  std::vector<std::vector<std::string>> rows;
  for (int f = 0; f < nf; ++f) {
    rows.push_back({F[f], c.money(cost[f])});
    for (int k = 0; k < nn; ++k) rows.back().push_back(c.num(a[k][f]));
  }
  for (int k = 0; k < nn; ++k) reqs.push_back(c.num(req[k]) + " " + N[k].unit + " of " + N[k].name);
  for (int f = 0; f < nf; ++f)
    if (ub[f] > 0) lims.push_back(c.num(ub[f]) + (ub[f] == 1 ? " serving of " : " servings of ") + F[f]);
  std::string lim_s = lims.empty() ? "" : " " + c.P({"For variety, the plan may include at most ", "No more than "}, {"Upper limits per day: "}) +
                                             join_and(lims) + (c.test ? "." : " per day.");
  std::string q = " " + c.ask_min("daily cost") + " " + c.P({"Servings can be fractional.", "Fractional servings are fine."}, {"Portions need not be whole."}) +
                  c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    s = (c.tmpl == 1 ? c.P({"A dietitian builds a daily menu from these foods (nutrients per serving):", "Nutrition facts per serving:"}, {""})
                     : "A hospital kitchen wants the cheapest daily menu that still meets the nutrition guidelines. Per serving:") +
        "\n\n" + md_table(head, rows) + "\n" + c.P({"The menu must provide at least ", "Daily minimums: "}, {"Guideline minimums for the day: "}) +
        join_and(reqs) + "." + lim_s + q;
  } else {
    s = c.P({"A student wants to meet daily nutrition needs as cheaply as possible using " + join_and(F) + ".",
             "A diet is to be planned from " + join_and(F) + "."},
            {""});
    for (int f = 0; f < nf; ++f) {
      std::vector<std::string> parts;
      for (int k = 0; k < nn; ++k) parts.push_back(c.num(a[k][f]) + " " + N[k].unit + " " + N[k].name);
      s += (c.tmpl == 2 ? "\n- " : " ") + cap1(F[f]) + (c.tmpl == 2 ? ": " + c.money(cost[f]) + " per serving, " + join_and(parts)
                                                                  : " costs " + c.money(cost[f]) + " per serving and gives " + join_and(parts) + ".");
    }
    s += (c.tmpl == 2 ? "\n" : " ") + std::string("Each day at least ") + join_and(reqs) + " are needed." + lim_s + q;
  }
  Formulation fm;
  std::vector<std::string> Nn;
  for (auto& n : N) Nn.push_back(n.name);
  fm.sets = {Formulation::set("F", F, "foods"), Formulation::set("N", Nn, "nutrients")};
  fm.params = {Formulation::param1("cost[f] (per serving)", F, cost), Formulation::param2("a[n,f] (amount per serving)", Nn, F, a),
               Formulation::param1("req[n] (daily minimum)", Nn, req)};
  fm.vars.push_back("x[f] >= 0 for f in F: servings of food f per day");
  fm.objective = "minimize sum_{f in F} cost[f] * x[f]";
  fm.constraints.push_back("nutrition[n]: sum_{f in F} a[n,f] * x[f] >= req[n] for each n in N");
  for (int f = 0; f < nf; ++f)
    if (ub[f] > 0) fm.constraints.push_back("limit: x[" + F[f] + "] <= " + c.num(ub[f]));
  in.formulation = fm.render();
}

// ---------------------------------------------------------------------------------------------
void build_portfolio(GenCtx& c, Instance& in) {
  struct Asset {
    std::string name;
    bool safe;
  };
  static const std::vector<Asset> pool = {{"government bonds", true}, {"municipal bonds", true}, {"money market fund", true},
                                          {"corporate bonds", false}, {"blue-chip stocks", false}, {"emerging-market stocks", false},
                                          {"real estate fund", false}, {"tech growth fund", false}};
  static const std::vector<std::string> who = {"an investment club", "a pension fund", "a university endowment", "a family office", "a charity"};
  const int na = c.uni(3, 5);
  std::vector<Asset> A;
  std::vector<int> idx = {0, 1, 2, 3, 4, 5, 6, 7};
  c.shuffle(idx);
  A.push_back(pool[c.uni(0, 2)]);
  for (int i : idx)
    if ((int)A.size() < na && pool[i].name != A[0].name) A.push_back(pool[i]);
  if (std::all_of(A.begin(), A.end(), [](auto& a) { return a.safe; })) A.back() = pool[4];
  const double B = c.stepped(50000, 1000000, 10000);
  std::vector<double> ret(na), cap(na, -1);
  for (int i = 0; i < na; ++i) ret[i] = A[i].safe ? c.stepped(1.5, 5, 0.25) : c.stepped(3.5, 14, 0.5);
  for (int i = 0; i < na; ++i)
    if (!A[i].safe && c.coin(0.6)) cap[i] = c.stepped(0.1 * B, 0.5 * B, 1000);
  const bool whole = c.coin(0.5);
  double safe_min = c.stepped(0.2 * B, 0.5 * B, 1000), risky_max = c.coin(0.5) ? c.stepped(0.3 * B, 0.7 * B, 1000) : -1;
  if (c.intent == Intent::Infeasible) {
    int ns = 0;
    for (auto& a : A) ns += a.safe;
    for (int i = 0; i < na; ++i)
      if (A[i].safe) cap[i] = c.stepped(0.02 * B, 0.8 * safe_min / ns, 1000);
    in.reason = "the caps on the safe assets add up to less than the required " + c.money(safe_min) + " in safe assets";
  }
  LpModel& m = in.model;
  m.maximize = true;
  const std::string pre = c.pick({"x_", "inv_", "amt_"});
  std::vector<int> x(na);
  Terms all, safe, risky;
  for (int i = 0; i < na; ++i) {
    x[i] = m.add_var(pre + ident(A[i].name), 0, cap[i] > 0 ? cap[i] : kLpInf);
    m.obj.push_back({x[i], ret[i] / 100});
    in.var_desc.push_back("amount invested in " + A[i].name);
    all.push_back({x[i], 1});
    (A[i].safe ? safe : risky).push_back({x[i], 1});
  }
  m.add_row("budget", all, whole ? RowSense::EQ : RowSense::LE, B);
  in.row_desc.push_back(whole ? "the whole budget is invested" : "at most the budget is invested");
  m.add_row("safe_min", safe, RowSense::GE, safe_min);
  in.row_desc.push_back("at least " + c.money(safe_min) + " in safe assets");
  if (risky_max > 0) {
    m.add_row("risky_max", risky, RowSense::LE, risky_max);
    in.row_desc.push_back("at most " + c.money(risky_max) + " in the other assets");
  }
  in.obj_desc = "expected annual return";
  std::vector<std::string> safe_n, risky_n, caps, rets;
  for (int i = 0; i < na; ++i) {
    (A[i].safe ? safe_n : risky_n).push_back(A[i].name);
    if (cap[i] > 0) caps.push_back(c.money(cap[i]) + " in " + A[i].name);
    rets.push_back(A[i].name + " " + c.pct(ret[i]));
  }
  std::string& s = in.statement;
  const std::string w = c.pick(who);
  std::string intro = c.tmpl == 3 ? "Briefing: " + w + " holds " + c.money(B) + " and asks us to split it across " + join_and(safe_n) + " (considered safe) and " + join_and(risky_n) + "."
                                  : cap1(w) + c.P({" has " + c.money(B) + " to invest", " plans to allocate " + c.money(B)}, {""}) + " among " +
                                        join_and(safe_n) + " (the safe options) and " + join_and(risky_n) + ".";
  std::string rules = (whole ? " " + c.P({"The entire amount must be invested.", "All of the money is to be placed."}, {"Every dollar gets invested."})
                             : " " + c.P({"Not all of it has to be invested.", "Uninvested cash earns nothing."}, {"Any remainder stays as cash earning nothing."})) +
                      " " + c.P({"At least " + c.money(safe_min) + " must go into the safe options", "The safe options must receive at least " + c.money(safe_min)},
                                {"A floor of " + c.money(safe_min) + " applies to the safe options combined"}) +
                      (risky_max > 0 ? ", and at most " + c.money(risky_max) + " may go into the others combined." : ".") +
                      (caps.empty() ? "" : " " + c.P({"Single-asset limits: at most ", "It may not put more than "}, {"Concentration caps: "}) + join_and(caps) + ".");
  std::string q = " " + c.ask_max("expected annual return") + c.maybe_infeasible_note();
  if (c.tmpl == 1 || c.tmpl == 3) {
    std::vector<std::vector<std::string>> rows;
    for (int i = 0; i < na; ++i) rows.push_back({A[i].name, A[i].safe ? "yes" : "no", c.pct(ret[i]), cap[i] > 0 ? c.money(cap[i]) : "none"});
    s = intro + "\n\n" + md_table({"Asset", "Safe", "Expected annual return", "Maximum"}, rows) + "\n" + rules.substr(1) + q;
  } else if (c.tmpl == 0) {
    s = intro + " " + c.P({"Expected annual returns are ", "The expected yearly returns are "}, {""}) + join_and(rets) + "." + rules + q;
  } else {
    s = intro + "\n";
    for (int i = 0; i < na; ++i) s += "- " + cap1(A[i].name) + ": expected return " + c.pct(ret[i]) + " per year\n";
    s += rules.substr(1) + q;
  }
  Formulation f;
  std::vector<std::string> An;
  std::vector<double> rr;
  for (int i = 0; i < na; ++i) An.push_back(A[i].name), rr.push_back(ret[i] / 100);
  f.sets = {Formulation::set("A", An, "assets"), Formulation::set("S", safe_n, "safe assets (subset of A)")};
  f.params = {Formulation::param1("r[a] (expected annual return as a fraction)", An, rr), "B = " + lp_num(B) + " (budget)",
              "Smin = " + lp_num(safe_min) + " (minimum in safe assets)"};
  if (risky_max > 0) f.params.push_back("Rmax = " + lp_num(risky_max) + " (maximum in A \\ S)");
  f.vars.push_back("x[a] >= 0 for a in A: amount invested in asset a");
  f.objective = "maximize sum_{a in A} r[a] * x[a]";
  f.constraints.push_back(std::string("budget: sum_{a in A} x[a] ") + (whole ? "= B" : "<= B"));
  f.constraints.push_back("safety: sum_{a in S} x[a] >= Smin");
  if (risky_max > 0) f.constraints.push_back("risk: sum_{a in A \\ S} x[a] <= Rmax");
  for (int i = 0; i < na; ++i)
    if (cap[i] > 0) f.constraints.push_back("cap: x[" + A[i].name + "] <= " + lp_num(cap[i]));
  in.formulation = f.render();
}

}  // namespace

void add_lp_families(std::vector<Family>& out) {
  out.push_back({"lp", "production", 3, 1, true, true, build_production});
  out.push_back({"lp", "blending", 3, 1, true, false, build_blending});
  out.push_back({"lp", "diet", 3, 1, true, false, build_diet});
  out.push_back({"lp", "portfolio", 3, 1, true, false, build_portfolio});
}

}  // namespace trex::orx
