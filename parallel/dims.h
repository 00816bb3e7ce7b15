// Parallel layout of a run: data (dp), tensor (tp), context (cp), pipeline (pp) and expert (ep)
// parallel sizes, validated against the world size, and the rank <-> coordinate map (topology
// only: nothing here knows the model).
//
// Conventions (Megatron-Core style; docs/PARALLEL.md has the pictures):
//  - world = tp * cp * dp * pp. Rank order: tp fastest, then cp, then dp, then pp:
//        rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
//    so a tp group is a run of consecutive ranks (one node, fastest links), and a cp group (the
//    ranks sharing the tokens of the same sequences, Megatron-Core's order) the next closest.
//  - Context parallel (cp): the cp ranks of a data rank read the same batches; cp rank r holds
//    chunks r and 2 cp - 1 - r of the 2 cp equal chunks of every sequence
//    (model/context_parallel.h). Every parameter is replicated over cp; gradients are reduced over dp x cp.
//  - ep divides dp: routed experts are sharded over ep ranks inside the data-parallel group
//    (same tp_rank, cp_rank and pp_rank). Inside the dp group, ep is the fastest coordinate:
//        ep_rank = dp_rank % ep,  edp_rank = dp_rank / ep,  edp = dp / ep
//    Expert parameters are replicated over the edp group (their gradients are reduced there);
//    dense parameters over the whole dp group.
//  - Layers are split over pp stages evenly (the middle stages take the remainder first, the
//    first and last stage last: they also hold the embedding and the head) unless
//    pp_layers gives the per-stage counts; the first and last stage may then hold fewer (even 0:
//    they also hold the embedding and the head).
// Pure: no MPI here, so it is unit-testable; make_process_groups builds the communicators from an
// already-created world Communicator.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trex::parallel {

class Communicator;

// Coordinates of one rank in the layout.
struct RankCoord {
  int tp = 0, dp = 0, pp = 0;  // tp_rank, dp_rank, pp_rank
  int cp = 0;                  // cp_rank
  int ep = 0, edp = 0;         // ep_rank = dp % ep, edp_rank = dp / ep
};

struct ParallelDims {
  int dp = 1, tp = 1, pp = 1, ep = 1, cp = 1;
  std::vector<int> pp_layers;  // optional: layers per stage, size pp, summing to num_hidden_layers

  int world() const { return dp * tp * cp * pp; }
  int edp() const { return ep > 0 ? dp / ep : 0; }  // expert-data-parallel size

  // Throws trex::UserError naming the field(s), the values and what to do when a size is < 1,
  // world_size != tp * cp * pp * dp, or ep does not divide dp. (Whether a model splits over the
  // layout is the model's question: model::check_split, model/split.h.)
  void validate_world(int world_size) const;

  // Layers per pp stage for a model of num_layers layers: pp_layers if given, else an even split
  // whose remainder goes to stages 1 .. pp-2 first, then stage 0, then stage pp-1. Result: [pp].
  std::vector<int> stage_layers(int64_t num_layers) const;
  // First layer of stage s (prefix sum of stage_layers).
  int64_t stage_first_layer(int64_t num_layers, int s) const;

  RankCoord coord(int rank) const;
  int rank_of(int tp_rank, int dp_rank, int pp_rank, int cp_rank = 0) const;

  // Member ranks (global, ascending = group rank order) of each group `rank` belongs to.
  std::vector<int> tp_group(int rank) const;   // same cp, dp, pp; size tp
  std::vector<int> cp_group(int rank) const;   // same tp, dp, pp; size cp
  std::vector<int> dp_group(int rank) const;   // same tp, cp, pp; size dp
  std::vector<int> pp_group(int rank) const;   // same tp, cp, dp; size pp
  std::vector<int> ep_group(int rank) const;   // same tp, cp, pp, edp_rank; size ep (consecutive dp ranks)
  std::vector<int> edp_group(int rank) const;  // same tp, cp, pp, ep_rank; size edp (dp ranks strided by ep)
  // Every rank holding the same routed experts (same ep_rank; any tp, cp, dp, pp): world / ep ranks,
  // ascending. Expert-sharded models reduce their experts' gradients over it.
  std::vector<int> expert_replica_group(int rank) const;
  // Pipeline memory sharding: every rank of `rank`'s stage (same pp_rank; any tp, cp, dp), and the
  // ranks of that stage holding the same routed experts (same pp_rank and ep_rank).
  std::vector<int> stage_group(int rank) const;
  std::vector<int> stage_expert_group(int rank) const;
  // Tensor-parallel memory sharding: every rank holding the same tp slice (same tp_rank; any cp,
  // dp, pp), and with pipeline memory sharding the stage's ranks of that tp rank (same tp_rank and
  // pp_rank; any cp, dp).
  std::vector<int> tp_slice_group(int rank) const;
  std::vector<int> stage_tp_slice_group(int rank) const;

  // Routed experts held by an ep rank: [first, first + count) of n_experts.
  int64_t experts_per_rank(int64_t n_experts) const { return n_experts / ep; }
  int64_t first_expert(int64_t n_experts, int ep_rank) const { return ep_rank * (n_experts / ep); }

  std::string str() const;  // "dp=2 tp=1 pp=1 ep=2 (edp=1, world=2)", " cp=2" after ep when cp > 1
};

// The communicators of one rank: built collectively by every rank of `world` (each call is a
// split of `world`, so all ranks must call this with the same dims).
struct ProcessGroups {
  std::unique_ptr<Communicator> tp, dp, pp, ep, edp, cp;
};
ProcessGroups make_process_groups(Communicator& world, const ParallelDims& dims);

}  // namespace trex::parallel
