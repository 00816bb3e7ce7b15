// Gradient buckets for data parallelism with a distributed optimizer (Megatron-Core
// DistributedOptimizer / ZeRO-1 layout), on one flat buffer per quantity (grads, params).
//
// Parameters are given in the order backward produces their gradients (the reverse of forward)
// and laid out back to back in that order. Consecutive parameters are grouped into buckets of at
// least bucket_size_elems elements (a parameter is never split; one larger than the bucket size
// gets a bucket of its own; the last bucket takes what is left). Each bucket is padded with zeros
// to a multiple of dp * shard_align elements so that its reduce-scatter has dp equal blocks:
//
//   flat:   | bucket 0                       | bucket 1               | ...
//           | p0 | p1 | p2 |pad| (dp shards) | p3      | p4 |pad|      |
//   shard r of bucket b: [begin + r * S, begin + (r + 1) * S),  S = bucket.size / dp
//
// Rank r's optimizer state covers its shard of every bucket (shard_elems() elements in all).
// Pure: no communication here (grad_sync.h runs the collectives).
#pragma once
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace trex::parallel {

// [begin, end) in the flat buffer.
struct FlatRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

struct Bucket {
  size_t begin = 0;                     // first element in the flat buffer
  size_t used = 0;                      // elements of parameters
  size_t size = 0;                      // padded size: a multiple of dp * shard_align, >= used
  int first_param = 0, num_params = 0;  // parameters [first_param, first_param + num_params)
};

// Where one parameter lives.
struct ParamSlot {
  int bucket = 0;
  size_t offset = 0;  // first element in the flat buffer
  size_t size = 0;
};

// The part of one parameter that falls in one rank's shard (for per-parameter optimizer settings
// such as no weight decay on norms): parameter elements [param_offset, + size) sit at flat
// elements [flat_begin, + size).
struct ShardPiece {
  int param = 0, bucket = 0;
  size_t param_offset = 0, flat_begin = 0, size = 0;
};

struct BucketLayout {
  int dp = 1;
  size_t shard_align = 1;
  size_t total = 0;  // flat buffer length, padding included
  std::vector<Bucket> buckets;
  std::vector<ParamSlot> params;  // indexed like param_sizes

  // param_sizes: element counts in backward order. bucket_size_elems: minimum elements per bucket
  // (0: one bucket for everything). dp >= 1. shard_align >= 1: every shard starts at a multiple
  // of shard_align elements from its bucket start (16 floats = 64 bytes suits AVX-512).
  static BucketLayout build(std::span<const size_t> param_sizes, size_t bucket_size_elems, int dp,
                            size_t shard_align = 1);

  int num_buckets() const { return static_cast<int>(buckets.size()); }
  size_t shard_size(int bucket) const;                      // elements per rank in `bucket`
  FlatRange shard(int bucket, int dp_rank) const;           // rank's shard of `bucket`
  size_t shard_elems() const;                               // sum of shard sizes over buckets (every rank)
  std::vector<ShardPiece> shard_pieces(int dp_rank) const;  // in flat order
  std::string str() const;                                  // one line per bucket, for logs
};

}  // namespace trex::parallel
