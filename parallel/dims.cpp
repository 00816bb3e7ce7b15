// ParallelDims: validation, coordinates and groups. See dims.h for the conventions.
#include "parallel/dims.h"

#include <numeric>

#include "core/error.h"
#include "parallel/comm.h"

namespace trex::parallel {

namespace {

void check_sizes(const ParallelDims& d) {
  const std::pair<const char*, int> sizes[] = {{"dp", d.dp}, {"tp", d.tp}, {"pp", d.pp}, {"ep", d.ep}, {"cp", d.cp}};
  for (auto [name, v] : sizes)
    TREX_USER_CHECK(v >= 1, "every parallel size is at least 1", "parallel.", name, " = ", v, " must be >= 1");
}

}  // namespace

void ParallelDims::validate_world(int world_size) const {
  check_sizes(*this);
  const int64_t prod = int64_t{tp} * cp * pp * dp;
  if (cp == 1)
    TREX_USER_CHECK(prod == world_size,
                    detail::cat("launch with mpirun -np ", prod,
                                ", or change parallel.dp / tp / pp so that tp * pp * dp = ", world_size),
                    "parallel.tp * parallel.pp * parallel.dp = ", tp, " * ", pp, " * ", dp, " = ", prod,
                    " but the run has ", world_size, " ranks (world size)");
  TREX_USER_CHECK(prod == world_size,
                  detail::cat("launch with mpirun -np ", prod,
                              ", or change parallel.dp / tp / cp / pp so that tp * cp * pp * dp = ", world_size),
                  "parallel.tp * parallel.cp * parallel.pp * parallel.dp = ", tp, " * ", cp, " * ", pp, " * ", dp,
                  " = ", prod, " but the run has ", world_size, " ranks (world size)");
  TREX_USER_CHECK(
      dp % ep == 0,
      "experts are sharded over ep ranks inside the data-parallel group: choose ep among the divisors of dp "
      "(raise parallel.dp or lower parallel.ep)",
      "parallel.ep = ", ep, " does not divide parallel.dp = ", dp);
}

std::vector<int> ParallelDims::stage_layers(int64_t num_layers) const {
  if (!pp_layers.empty()) return pp_layers;
  std::vector<int> out(pp, static_cast<int>(num_layers / pp));
  int64_t rem = num_layers % pp;
  std::vector<int> order;  // middle stages first, then the first, then the last
  for (int s = 1; s < pp - 1; ++s) order.push_back(s);
  order.push_back(0);
  if (pp > 1) order.push_back(pp - 1);
  for (int i = 0; rem > 0; ++i, --rem) out[order[i]] += 1;
  return out;
}

int64_t ParallelDims::stage_first_layer(int64_t num_layers, int s) const {
  TREX_CHECK(s >= 0 && s < pp, "stage ", s, " outside [0, ", pp, ")");
  auto v = stage_layers(num_layers);
  return std::accumulate(v.begin(), v.begin() + s, int64_t{0});
}

RankCoord ParallelDims::coord(int rank) const {
  TREX_CHECK(rank >= 0 && rank < world(), "rank ", rank, " outside [0, ", world(), ") for ", str());
  RankCoord c;
  c.tp = rank % tp;
  c.cp = (rank / tp) % cp;
  c.dp = (rank / (tp * cp)) % dp;
  c.pp = rank / (tp * cp * dp);
  c.ep = c.dp % ep;
  c.edp = c.dp / ep;
  return c;
}

int ParallelDims::rank_of(int tp_rank, int dp_rank, int pp_rank, int cp_rank) const {
  TREX_CHECK(tp_rank >= 0 && tp_rank < tp && dp_rank >= 0 && dp_rank < dp && pp_rank >= 0 && pp_rank < pp &&
                 cp_rank >= 0 && cp_rank < cp,
             "coordinates (tp ", tp_rank, ", cp ", cp_rank, ", dp ", dp_rank, ", pp ", pp_rank, ") outside ", str());
  return tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank));
}

std::vector<int> ParallelDims::tp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (int t = 0; t < tp; ++t) g.push_back(rank_of(t, c.dp, c.pp, c.cp));
  return g;
}

std::vector<int> ParallelDims::cp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (int k = 0; k < cp; ++k) g.push_back(rank_of(c.tp, c.dp, c.pp, k));
  return g;
}

std::vector<int> ParallelDims::dp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (int d = 0; d < dp; ++d) g.push_back(rank_of(c.tp, d, c.pp, c.cp));
  return g;
}

std::vector<int> ParallelDims::pp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (int p = 0; p < pp; ++p) g.push_back(rank_of(c.tp, c.dp, p, c.cp));
  return g;
}

std::vector<int> ParallelDims::ep_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (int e = 0; e < ep; ++e) g.push_back(rank_of(c.tp, c.edp * ep + e, c.pp, c.cp));
  return g;
}

std::vector<int> ParallelDims::edp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (int i = 0; i < edp(); ++i) g.push_back(rank_of(c.tp, i * ep + c.ep, c.pp, c.cp));
  return g;
}

namespace {

// The ranks (ascending) whose coordinates satisfy same(coord).
template <class Same>
std::vector<int> ranks_where(const ParallelDims& d, Same same) {
  std::vector<int> g;
  for (int r = 0; r < d.world(); ++r)
    if (same(d.coord(r))) g.push_back(r);
  return g;
}

}  // namespace

std::vector<int> ParallelDims::expert_replica_group(int rank) const {
  const RankCoord c = coord(rank);
  return ranks_where(*this, [&](const RankCoord& o) { return o.ep == c.ep; });
}

std::vector<int> ParallelDims::stage_group(int rank) const {
  const RankCoord c = coord(rank);
  return ranks_where(*this, [&](const RankCoord& o) { return o.pp == c.pp; });
}

std::vector<int> ParallelDims::stage_expert_group(int rank) const {
  const RankCoord c = coord(rank);
  return ranks_where(*this, [&](const RankCoord& o) { return o.pp == c.pp && o.ep == c.ep; });
}

std::vector<int> ParallelDims::tp_slice_group(int rank) const {
  const RankCoord c = coord(rank);
  return ranks_where(*this, [&](const RankCoord& o) { return o.tp == c.tp; });
}

std::vector<int> ParallelDims::stage_tp_slice_group(int rank) const {
  const RankCoord c = coord(rank);
  return ranks_where(*this, [&](const RankCoord& o) { return o.tp == c.tp && o.pp == c.pp; });
}

std::string ParallelDims::str() const {
  return detail::cat("dp=", dp, " tp=", tp, " pp=", pp, " ep=", ep, cp > 1 ? detail::cat(" cp=", cp) : "",
                     " (edp=", edp(), ", world=", world(), ")");
}

ProcessGroups make_process_groups(Communicator& world, const ParallelDims& dims) {
  dims.validate_world(world.size());
  const int r = world.rank();
  ProcessGroups g;
  g.tp = world.group(dims.tp_group(r));
  g.dp = world.group(dims.dp_group(r));
  g.pp = world.group(dims.pp_group(r));
  g.ep = world.group(dims.ep_group(r));
  g.edp = world.group(dims.edp_group(r));
  g.cp = world.group(dims.cp_group(r));
  return g;
}

}  // namespace trex::parallel
