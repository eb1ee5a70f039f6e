// The WildCat family's operators as the backends see them: what the boundary checks
// produce and dispatch (common/dispatch.h) hands to a backend. The CPU backend's run
// overloads are in wildcat.cpp, weighted_kv.cpp, compress_kv.cpp and cache_baselines.cpp
// (streaming_llm_select only names tokens and has no kernel).
#pragma once

#include "common/dispatch.h"
#include "subquad/wildcat.h"

namespace subquad::wildcat {

// q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv]; options
// checked, B N H Dv >= 1.
struct WildcatParams {
  View4<const float> q, k, v;
  WildcatOptions options;
  View4<float> out;
};

// Attention over weighted entries (checked by weighted_kv_attention): q [B, N, H, D] ->
// out [B, N, H, Dv], scale beta resolved.
struct WeightedAttendParams {
  const WeightedKV& kv;
  View4<const float> q;
  float beta;
  View4<float> out;
};

// k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> the entries kept (options checked).
struct CompressKVParams {
  const CompressKV& compressor;
  CompressKVOptions options;
  View4<const float> k, v;
};

// The SnapKV selection: observation queries q_obs [B, W, H, D], k [B, M, Hkv, D],
// v [B, M, Hkv, Dv] -> the entries kept (options checked, beta resolved).
struct SnapKVParams {
  View4<const float> q_obs, k, v;
  SnapKVOptions options;
  float beta;
};

}  // namespace subquad::wildcat

namespace subquad::cpu {

void run(Backend, const Context& context, const wildcat::WildcatParams& params);
void run(Backend, const Context& context, const wildcat::WeightedAttendParams& params);
KVSelection run(Backend, const Context& context, const wildcat::CompressKVParams& params);
KVSelection run(Backend, const Context& context, const wildcat::SnapKVParams& params);

}  // namespace subquad::cpu
