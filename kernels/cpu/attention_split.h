// Shared by the flash-attention kernels (kernels/cpu/attention_tiles.h, instantiated by
// attention_avx512.cpp and attention_avx2.cpp): which tiles a (b, h) visits, and how a call is
// spread over threads. Work items are (b, h) pairs, cut into parts of their query (forward) or key
// (backward) blocks only when B x H alone does not give every thread enough items. A backward cut
// into key-block parts makes dq a sum over the parts: each part writes its own partial, added up
// at the end.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "kernels/attention.h"

namespace trex::kern::cpu {

// Parts per (b, h) (of `blocks` blocks each) so that there are about `per_thread` work items per
// thread: 1 when B*H alone provides them.
int attn_split_count(int64_t BH, int blocks, int per_thread);

// The dq partials of a backward cut into nsplit parts per (b, h): [B*H, nsplit, Tq, Dqk] (Tq =
// sh.rows()), 64-byte aligned; null when nsplit == 1.
using DqPartials = std::unique_ptr<float, decltype(&std::free)>;
DqPartials alloc_dq_partials(const AttnShape& sh, int nsplit);
// dq [B, Tq, H, Dqk] = the sum over the parts of part (nsplit > 1).
void sum_dq_partials(const AttnShape& sh, int nsplit, const float* part, float* dq);

// Visibility of a (query block, key block) tile of one (b, h): query positions [qs, qs + nq), key rows
// [ks, ks + nk), causal, within sh.window, and (segrow: the row's segment ids, else null) in the
// same segment: 0 no pair visible, 1 some (the tile needs masks), 2 every pair.
int tile_kind(const AttnShape& sh, int qs, int nq, int ks, int nk, const int32_t* segrow);

}  // namespace trex::kern::cpu
