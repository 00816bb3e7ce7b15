// Category "network", graph families: min-cost flow, shortest path, max flow (arc-flow LPs on a
// random directed network). Templates t0..t2 train-only, t3 test-only.
#include <algorithm>
#include <cmath>
#include "or/generator.h"
#include "or/lp_writer.h"

namespace trex::orx {

namespace {

struct Arc {
  int a, b;
  double cap, cost;
};
struct Net {
  std::vector<std::string> names;
  std::vector<Arc> arcs;
  std::string node, nodes;  // "town", "towns"
};

// Random acyclic network on n nodes: every node but the last has an arc out to a later node,
// every node but the first an arc in from an earlier node.
Net random_net(GenCtx& c, int n) {
  static const std::vector<std::vector<std::string>> pools = {
      {"Alton", "Bexley", "Carver", "Dunmore", "Easton", "Fairview", "Greenock", "Harlow"},
      {"A", "B", "C", "D", "E", "F", "G", "H"},
      {"N1", "N2", "N3", "N4", "N5", "N6", "N7", "N8"},
      {"Pier", "Quarry", "Ridge", "Summit", "Tower", "Union", "Valley", "Wharf"}};
  static const std::vector<std::pair<std::string, std::string>> kinds = {{"town", "towns"}, {"node", "nodes"}, {"junction", "junctions"}, {"station", "stations"}};
  const int k = c.uni(0, 3);
  Net g;
  g.names.assign(pools[k].begin(), pools[k].begin() + n);
  g.node = kinds[k].first;
  g.nodes = kinds[k].second;
  const double p = n <= 5 ? 0.55 : 0.4;
  std::vector<std::vector<char>> has(n, std::vector<char>(n, 0));
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (!(i == 0 && j == n - 1) && c.coin(p)) has[i][j] = 1;
  for (int i = 0; i + 1 < n; ++i) {
    bool out = false;
    for (int j = i + 1; j < n; ++j) out |= has[i][j];
    if (!out) has[i][std::min(n - 1, i + 1 + (i == 0 && n > 2 ? 0 : c.uni(0, 1)))] = 1;
  }
  for (int j = 1; j < n; ++j) {
    bool inn = false;
    for (int i = 0; i < j; ++i) inn |= has[i][j];
    if (!inn) has[std::max(0, j - 1)][j] = 1;
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (has[i][j]) g.arcs.push_back({i, j, 0, 0});
  return g;
}

std::string arc_var(const std::string& pre, const Net& g, const Arc& a) {
  return pre + ident(g.names[a.a]) + "_" + ident(g.names[a.b]);
}

// Rows "out - in (sense) rhs" for every node in `which`.
void balance_rows(LpModel& m, Instance& in, const Net& g, const std::vector<int>& xv, int v, RowSense s, double rhs, bool in_minus_out,
                  const std::string& desc) {
  Terms t;
  for (size_t k = 0; k < g.arcs.size(); ++k) {
    if (g.arcs[k].a == v) t.push_back({xv[k], in_minus_out ? -1.0 : 1.0});
    if (g.arcs[k].b == v) t.push_back({xv[k], in_minus_out ? 1.0 : -1.0});
  }
  if (t.empty()) return;
  m.add_row("node_" + ident(g.names[v]), t, s, rhs);
  in.row_desc.push_back(desc);
}

std::string arc_table(GenCtx& c, const Net& g, const std::vector<std::string>& cols, bool cap, bool cost, bool cost_money,
                      const std::string& unlimited_label = "unlimited") {
  std::vector<std::vector<std::string>> rows;
  for (const auto& a : g.arcs) {
    rows.push_back({g.names[a.a], g.names[a.b]});
    if (cap) rows.back().push_back(lp_is_inf(a.cap) ? unlimited_label : c.num(a.cap));
    if (cost) rows.back().push_back(cost_money ? c.money(a.cost) : c.num(a.cost));
  }
  return md_table(cols, rows);
}

// "Alton->Bexley 7, Bexley->Carver 3" with the capacity (cap) or the cost of every arc.
std::string arc_list(const Net& g, bool cap) {
  std::string s;
  for (size_t k = 0; k < g.arcs.size(); ++k) {
    const Arc& a = g.arcs[k];
    s += (k ? ", " : "") + g.names[a.a] + "->" + g.names[a.b] + " " + (cap ? (lp_is_inf(a.cap) ? std::string("unlimited") : lp_num(a.cap)) : lp_num(a.cost));
  }
  return s;
}

void build_shortest_path(GenCtx& c, Instance& in) {
  const int n = c.uni(5, 8);
  Net g = random_net(c, n);
  const bool two_way = c.intent != Intent::Infeasible && c.coin(0.4);
  const std::string unit = c.pick({"km", "minutes", "miles"});
  for (auto& a : g.arcs) a.cost = c.uni(2, 30);
  if (c.intent == Intent::Infeasible) {
    for (auto& a : g.arcs)
      if (a.b == n - 1) std::swap(a.a, a.b);
    in.reason = "no link leads into " + g.names[n - 1];
  }
  const size_t base = g.arcs.size();
  if (two_way)
    for (size_t k = 0; k < base; ++k) g.arcs.push_back({g.arcs[k].b, g.arcs[k].a, 0, g.arcs[k].cost});
  LpModel& m = in.model;
  std::vector<int> xv;
  for (const auto& a : g.arcs) {
    xv.push_back(m.add_var(arc_var("x_", g, a)));
    m.obj.push_back({xv.back(), a.cost});
    in.var_desc.push_back("1 if the path uses the link " + g.names[a.a] + " -> " + g.names[a.b]);
  }
  for (int v = 0; v < n; ++v)
    balance_rows(m, in, g, xv, v, RowSense::EQ, v == 0 ? 1 : v == n - 1 ? -1 : 0, false,
                 v == 0 ? "the path leaves the start" : v == n - 1 ? "the path reaches the destination" : "flow through " + g.names[v] + " is conserved");
  in.obj_desc = "length of the shortest route in " + unit;
  in.money = false;
  const std::string S = g.names[0], T = g.names[n - 1];
  Net shown = g;
  shown.arcs.resize(base);
  std::string dir = two_way ? c.P({"All links can be travelled in both directions.", "Roads are two-way."}, {"Every connection works both ways."})
                            : c.P({"Links are one-way, in the direction given.", "Each link can only be used in the listed direction."}, {"Connections are directed."});
  std::string q = " " + c.ask_min("travel distance from " + S + " to " + T + " (in " + unit + ")") + c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    s = (c.tmpl == 3 ? "Routing query: a courier must get from " + S + " to " + T + ". Available connections and their lengths:"
                     : c.P({"A driver wants the shortest route from " + S + " to " + T + ". The network of " + g.nodes + " has these links:",
                            "Find a shortest path from " + S + " to " + T + " in the network below."}, {""})) +
        "\n\n" + arc_table(c, shown, {"From", "To", "Length (" + unit + ")"}, false, true, false) + "\n" + dir + q;
  } else {
    std::vector<std::string> parts;
    for (const auto& a : shown.arcs) parts.push_back(g.names[a.a] + (two_way ? "-" : "->") + g.names[a.b] + " " + c.num(a.cost) + " " + unit);
    s = c.P({"A network connects the " + g.nodes + " " + join_and(g.names) + ".", "Consider " + count_word(n) + " " + g.nodes + ": " + join_and(g.names) + "."}, {""}) + " " + dir;
    if (c.tmpl == 2) {
      s += "\n";
      for (auto& p : parts) s += "- " + p + "\n";
      s += q.substr(1);
    } else {
      s += " The links and their lengths are: " + join_and(parts) + "." + q;
    }
  }
  Formulation f;
  f.sets = {Formulation::set("N", g.names, g.nodes), "A: the directed links (i,j) listed" + std::string(two_way ? " (each road in both directions)" : ""),
            "s = " + S + ", t = " + T};
  f.params = {"len[i,j] (length of link (i,j)): " + arc_list(g, false)};
  f.vars = {"x[i,j] >= 0 for (i,j) in A: 1 if link (i,j) is on the path (the LP has an integral optimum)"};
  f.objective = "minimize sum_{(i,j) in A} len[i,j] * x[i,j]";
  f.constraints = {"flow[v]: sum_{(v,j) in A} x[v,j] - sum_{(i,v) in A} x[i,v] = (1 if v = s, -1 if v = t, 0 otherwise) for each v in N"};
  in.formulation = f.render();
}

void build_max_flow(GenCtx& c, Instance& in) {
  const int n = c.uni(5, 7);
  Net g = random_net(c, n);
  const std::string unit = c.pick({"liters per second", "vehicles per hour", "units per day", "megabits per second"});
  const int scale = c.coin(0.3) ? 10 : 1;
  for (auto& a : g.arcs) a.cap = c.uni(2, 40) * scale;
  if (c.intent == Intent::Unbounded) {
    g.arcs.push_back({0, n - 1, kLpInf, 0});
    in.reason = "the direct link from " + g.names[0] + " to " + g.names[n - 1] + " has no capacity limit";
  }
  LpModel& m = in.model;
  m.maximize = true;
  std::vector<int> xv;
  for (const auto& a : g.arcs) {
    xv.push_back(m.add_var(arc_var("f_", g, a), 0, a.cap));
    in.var_desc.push_back("flow on " + g.names[a.a] + " -> " + g.names[a.b]);
    if (a.a == 0) m.obj.push_back({xv.back(), 1});
  }
  for (int v = 1; v + 1 < n; ++v) balance_rows(m, in, g, xv, v, RowSense::EQ, 0, false, "flow conservation at " + g.names[v]);
  in.obj_desc = "maximum flow from " + g.names[0] + " to " + g.names[n - 1] + " (" + unit + ")";
  in.money = false;
  const std::string S = g.names[0], T = g.names[n - 1];
  std::string q = " " + c.ask_max("total flow from " + S + " to " + T) + c.maybe_infeasible_note();
  std::string note = " " + c.P({"Flow is conserved at every intermediate " + g.node + ".", "Whatever enters an intermediate " + g.node + " must leave it."},
                               {"Intermediate " + g.nodes + " store nothing."});
  std::string& s = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    s = (c.tmpl == 3 ? "Capacity check: how much can the network carry from " + S + " to " + T + "? Link capacities (" + unit + "):"
                     : c.P({"A pipeline network carries flow from " + S + " to " + T + ". Link capacities in " + unit + ":", "The directed links of the network and their capacities (" + unit + "):"}, {""})) +
        "\n\n" + arc_table(c, g, {"From", "To", "Capacity"}, true, false, false) + note.substr(1) + q;
  } else {
    std::vector<std::string> parts;
    for (const auto& a : g.arcs) parts.push_back(g.names[a.a] + "->" + g.names[a.b] + " " + (lp_is_inf(a.cap) ? std::string("unlimited") : c.num(a.cap)));
    s = c.P({"Flow is sent from " + S + " to " + T + " through the " + g.nodes + " " + join_and(g.names) + ".", "A network of " + count_word(n) + " " + g.nodes + " links " + S + " to " + T + "."}, {""}) +
        " " + c.P({"Each directed link has a capacity in " + unit + ":", "Link capacities (" + unit + "):"}, {""});
    if (c.tmpl == 2) {
      s += "\n";
      for (auto& p : parts) s += "- " + p + "\n";
      s += note.substr(1) + q;
    } else {
      s += " " + join_and(parts) + "." + note + q;
    }
  }
  Formulation f;
  f.sets = {Formulation::set("N", g.names, g.nodes), "A: the directed links listed", "s = " + S + ", t = " + T};
  f.params = {"u[i,j] (capacity of link (i,j)): " + arc_list(g, true)};
  f.vars = {"f[i,j] with 0 <= f[i,j] <= u[i,j] for (i,j) in A: flow on the link"};
  f.objective = "maximize sum_{(s,j) in A} f[s,j]";
  f.constraints = {"conservation[v]: sum_{(i,v) in A} f[i,v] = sum_{(v,j) in A} f[v,j] for each v in N other than s and t"};
  in.formulation = f.render();
}

void build_min_cost_flow(GenCtx& c, Instance& in) {
  const int n = c.uni(5, 7);
  Net g = random_net(c, n);
  const bool two_src = n >= 6 && c.intent != Intent::Infeasible && c.coin(0.5);
  for (auto& a : g.arcs) a.cap = c.uni(10, 60), a.cost = c.uni(1, 12);
  double into_t = 0;
  for (const auto& a : g.arcs)
    if (a.b == n - 1) into_t += a.cap;
  double dem = c.intent == Intent::Infeasible ? into_t + c.uni(1, 20) : std::max(1.0, std::floor(into_t * c.unif(0.2, 0.6)));
  std::vector<double> sup(n, 0);
  if (two_src) {
    sup[0] = std::ceil(dem * c.unif(0.5, 0.9));
    sup[1] = std::ceil(dem * c.unif(0.4, 0.8));
    if (sup[0] + sup[1] < dem) sup[1] = dem - sup[0];
  } else {
    sup[0] = dem + (c.coin(0.5) ? 0 : c.uni(1, 30));
  }
  if (c.intent == Intent::Infeasible) {
    sup[0] = dem;
    in.reason = "the links into " + g.names[n - 1] + " can carry only " + c.num(into_t) + " units in total";
  }
  LpModel& m = in.model;
  std::vector<int> xv;
  for (const auto& a : g.arcs) {
    xv.push_back(m.add_var(arc_var("x_", g, a), 0, a.cap));
    m.obj.push_back({xv.back(), a.cost});
    in.var_desc.push_back("units sent on " + g.names[a.a] + " -> " + g.names[a.b]);
  }
  for (int v = 0; v < n; ++v) {
    if (sup[v] > 0) balance_rows(m, in, g, xv, v, RowSense::LE, sup[v], false, g.names[v] + " sends at most its supply of " + c.num(sup[v]));
    else if (v == n - 1) balance_rows(m, in, g, xv, v, RowSense::EQ, dem, true, g.names[v] + " receives its demand of " + c.num(dem));
    else balance_rows(m, in, g, xv, v, RowSense::EQ, 0, false, "conservation at " + g.names[v]);
  }
  in.obj_desc = "total shipping cost";
  const std::string T = g.names[n - 1];
  std::vector<std::string> srcs;
  for (int v = 0; v < n; ++v)
    if (sup[v] > 0) srcs.push_back(g.names[v] + " (" + c.num(sup[v]) + " units available)");
  std::string rules = " " + c.P({"Supply is available at ", "Goods originate at "}, {"Sources: "}) + join_and(srcs) + "; " + T +
                      c.P({" requires exactly " + c.num(dem) + " units.", " must receive " + c.num(dem) + " units."}, {" needs a delivery of " + c.num(dem) + " units."}) +
                      " " + c.P({"All other " + g.nodes + " are transshipment points.", "Intermediate " + g.nodes + " neither create nor absorb goods."}, {"Other " + g.nodes + " only pass goods on."});
  std::string q = " " + c.ask_min("total shipping cost") + c.maybe_infeasible_note();
  std::string& s = in.statement;
  if (c.tmpl == 1 || c.tmpl == 3) {
    s = (c.tmpl == 3 ? "Distribution problem on a directed network; each link has a capacity and a cost per unit:"
                     : c.P({"Goods move through a network of " + g.nodes + ". Each directed link has a capacity and a unit cost:", "Network data (capacity in units, cost per unit):"}, {""})) +
        "\n\n" + arc_table(c, g, {"From", "To", "Capacity", "Cost per unit"}, true, true, true) + rules.substr(1) + q;
  } else {
    std::vector<std::string> parts;
    for (const auto& a : g.arcs) parts.push_back(g.names[a.a] + "->" + g.names[a.b] + " (capacity " + c.num(a.cap) + ", " + c.money(a.cost) + " per unit)");
    s = c.P({"A company routes goods through the " + g.nodes + " " + join_and(g.names) + ".", "Consider a distribution network with " + g.nodes + " " + join_and(g.names) + "."}, {""}) + rules;
    if (c.tmpl == 2) {
      s += "\nLinks:\n";
      for (auto& p : parts) s += "- " + p + "\n";
      s += q.substr(1);
    } else {
      s += " The directed links are " + join_and(parts) + "." + q;
    }
  }
  Formulation f;
  f.sets = {Formulation::set("N", g.names, g.nodes), "A: the directed links listed"};
  std::vector<std::string> supply_s;
  for (int v = 0; v < n; ++v)
    if (sup[v] > 0) supply_s.push_back(g.names[v] + " " + lp_num(sup[v]));
  f.params = {"u[i,j] (capacity): " + arc_list(g, true), "c[i,j] (cost per unit): " + arc_list(g, false),
              "supply[v]: " + join(supply_s, ", "), "demand at " + T + ": " + lp_num(dem)};
  f.vars = {"x[i,j] with 0 <= x[i,j] <= u[i,j] for (i,j) in A: units sent on the link"};
  f.objective = "minimize sum_{(i,j) in A} c[i,j] * x[i,j]";
  f.constraints = {"source[v]: sum_{(v,j)} x[v,j] - sum_{(i,v)} x[i,v] <= supply[v] at each source",
                   "sink: sum_{(i,t)} x[i,t] - sum_{(t,j)} x[t,j] = demand at " + T,
                   "transship[v]: sum_{(v,j)} x[v,j] - sum_{(i,v)} x[i,v] = 0 at every other node"};
  in.formulation = f.render();
}

}  // namespace

void add_graph_families(std::vector<Family>& out) {
  out.push_back({"network", "min_cost_flow", 3, 1, true, false, build_min_cost_flow});
  out.push_back({"network", "shortest_path", 3, 1, true, false, build_shortest_path});
  out.push_back({"network", "max_flow", 3, 1, false, true, build_max_flow});
}

}  // namespace trex::orx
