// DeepSeek-V4 incremental forward for generation: a per-sequence cache and a feed of new tokens
// to several sequences at once, giving the logits the full forward (Model::v4_last_logits) gives
// for each sequence's last token.
//   per layer and sequence the cache holds
//     kv        [<= W-1, hd]   the last W-1 sliding rows (kv_norm + RoPE): the window of the next query
//     C         [nw, hd]       compressed entries (HCA / CSA), normed and roped, entry w at position w*m
//     ckv, cgate [r, c*hd]     the compressor's projections of the rows the next entry still needs
//                              (the running window; CSA: also the previous window, whose "Ca" half
//                              the next entry pools)
//     IK        [nw, dI]       CSA: the indexer's compressed keys; iks, igs its running window
//   Hyper-connection streams, the MoE and the head are per token: nothing of them is kept.
// A feed runs every per-token matmul (projections, MoE, head) once over the new tokens of all the
// sequences; the compressors, the indexer's top-k and the key lists are per sequence. Positions are
// each sequence's own 0, 1, ... (as a batch row of its own in the training forward).
#pragma once
#include <cstdint>
#include <vector>
#include "model/model.h"

namespace trex::model {

struct V4LayerCache {
  int64_t kv_base = 0;            // position of kv's first row
  std::vector<float> kv;          // [len - kv_base, hd]
  int64_t nw = 0;                 // complete compressed entries
  std::vector<float> C;           // [nw, hd]
  int64_t run_base = 0;           // position of the first row of ckv / cgate / iks / igs
  std::vector<float> ckv, cgate;  // [len - run_base, c*hd]
  std::vector<float> IK;          // [nw, dI] (CSA)
  std::vector<float> iks, igs;    // [len - run_base, 2*dI] (CSA)
};

struct V4Cache {
  int64_t len = 0;                  // tokens fed so far
  std::vector<V4LayerCache> layers;  // [num_hidden_layers]
  void reset() {
    len = 0;
    layers.clear();
  }
};

// One sequence's part of a feed: n >= 1 tokens ids at positions cache->len ...
struct V4Feed {
  V4Cache* cache;
  const int32_t* ids;
  int64_t n;
};

// Feeds every part at once (distinct caches) and advances their caches -> logits [parts, vocab]:
// row b the logits after part b's last token. Forward only, on the host (P(), the CPU kernels);
// bf16 precision as the training forward rounds.
void v4_decode_feed(Model& m, const std::vector<V4Feed>& parts, float* logits);

}  // namespace trex::model
