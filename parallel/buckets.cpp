// BucketLayout: grouping parameters into padded, dp-sharded buckets. See buckets.h.
#include "parallel/buckets.h"

#include <algorithm>

#include "core/error.h"

namespace trex::parallel {

BucketLayout BucketLayout::build(std::span<const size_t> param_sizes, size_t bucket_size_elems, int dp,
                                 size_t shard_align) {
  TREX_CHECK(dp >= 1, "BucketLayout: dp = ", dp, " must be >= 1");
  TREX_CHECK(shard_align >= 1, "BucketLayout: shard_align = ", shard_align, " must be >= 1");
  BucketLayout L;
  L.dp = dp;
  L.shard_align = shard_align;
  L.params.resize(param_sizes.size());
  const size_t quantum = static_cast<size_t>(dp) * shard_align;
  size_t pos = 0;
  Bucket cur;
  auto close = [&] {
    cur.size = (cur.used + quantum - 1) / quantum * quantum;
    pos = cur.begin + cur.size;
    L.buckets.push_back(cur);
    cur = Bucket{};
    cur.begin = pos;
    cur.first_param = static_cast<int>(L.buckets.back().first_param + L.buckets.back().num_params);
  };
  for (size_t i = 0; i < param_sizes.size(); ++i) {
    ParamSlot& s = L.params[i];
    s.bucket = static_cast<int>(L.buckets.size());
    s.offset = cur.begin + cur.used;
    s.size = param_sizes[i];
    cur.used += param_sizes[i];
    cur.num_params += 1;
    if (bucket_size_elems > 0 && cur.used >= bucket_size_elems) close();
  }
  if (cur.num_params > 0) close();
  L.total = pos;
  return L;
}

size_t BucketLayout::shard_size(int bucket) const {
  TREX_CHECK(bucket >= 0 && bucket < num_buckets(), "bucket ", bucket, " outside [0, ", num_buckets(), ")");
  return buckets[bucket].size / dp;
}

FlatRange BucketLayout::shard(int bucket, int dp_rank) const {
  TREX_CHECK(dp_rank >= 0 && dp_rank < dp, "dp rank ", dp_rank, " outside [0, ", dp, ")");
  const size_t S = shard_size(bucket);
  const size_t b = buckets[bucket].begin + static_cast<size_t>(dp_rank) * S;
  return {b, b + S};
}

size_t BucketLayout::shard_elems() const {
  size_t n = 0;
  for (const Bucket& b : buckets) n += b.size / dp;
  return n;
}

std::vector<ShardPiece> BucketLayout::shard_pieces(int dp_rank) const {
  std::vector<ShardPiece> out;
  for (int b = 0; b < num_buckets(); ++b) {
    const FlatRange r = shard(b, dp_rank);
    const Bucket& B = buckets[b];
    for (int p = B.first_param; p < B.first_param + B.num_params; ++p) {
      const ParamSlot& s = params[p];
      const size_t lo = std::max(r.begin, s.offset), hi = std::min(r.end, s.offset + s.size);
      if (lo < hi) out.push_back({p, b, lo - s.offset, lo, hi - lo});
    }
  }
  return out;
}

std::string BucketLayout::str() const {
  std::string s = detail::cat("BucketLayout dp=", dp, " total=", total, " buckets=", buckets.size(), "\n");
  for (int b = 0; b < num_buckets(); ++b) {
    const Bucket& B = buckets[b];
    s += detail::cat("  bucket ", b, ": params [", B.first_param, ", ", B.first_param + B.num_params, ") flat [",
                     B.begin, ", ", B.begin + B.size, ") used ", B.used, " pad ", B.size - B.used, " shard ",
                     B.size / dp, "\n");
  }
  return s;
}

}  // namespace trex::parallel
