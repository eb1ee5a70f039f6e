// Inputs of `subquad bench`: standard-normal q, k, v, or the Q/K/V that SmolLM2-135M computes
// on real text, captured by `subquad-llm capture` into a folder (generated on demand, never
// committed). On Gaussian inputs exact attention is nearly uniform and every approximation
// shows a relative error of 0.7-0.8; on the captured workload the methods separate.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "registry.h"

namespace subquad::cli {

// A captured workload: B = captured blocks (one batch entry each), N tokens, H query heads.
// k and v are stored as the model's Hkv heads and expanded here to H (query head h reads kv
// head h / (H / Hkv), the GQA rule), because the bench's methods take as many kv heads as
// query heads.
struct CapturedWorkload {
  std::string directory;
  int64_t batch = 0, tokens = 0, heads = 0, kv_heads = 0, head_dim = 0, value_dim = 0;
  std::vector<float> q;     // [B, N, H, D]
  std::vector<float> k, v;  // [B, N, H, D], [B, N, H, Dv]
};

// $SUBQUAD_WORKLOAD_DIR, else $XDG_CACHE_HOME/subquad/smollm2, else ~/.cache/subquad/smollm2:
// the folder `subquad-llm capture` writes by default.
std::string default_workload_dir();

// Whether `directory` holds a workload's q.npy (the rest is checked by loading it).
bool has_captured_workload(const std::string& directory);

// Loads q.npy [B, N, H, D], k.npy [B, N, Hkv, D] and v.npy [B, N, Hkv, Dv] (float32 or
// float64) from `directory`, after checking them against manifest.txt, which `subquad-llm
// capture` writes last: a line "<sha256> <bytes> <file>" per file ('#' starts a comment).
// A missing folder, file or manifest, a file that does not match the manifest (a capture
// interrupted between files), a corrupt array, disagreeing shapes or non-finite values
// throw an Error naming the file and the command that regenerates it.
CapturedWorkload load_captured_workload(const std::string& directory);

// The bench lengths of a captured workload: 256, 1024, 4096, ... below N, then N itself.
std::vector<int64_t> captured_lengths(const CapturedWorkload& workload);

// The first `tokens` positions of every batch entry (a causal model's q, k, v at the first n
// positions do not depend on what follows, so a prefix is the model's own workload of length
// n). Throws when tokens exceeds the captured N.
BenchInputs captured_prefix(const CapturedWorkload& workload, int64_t tokens);

// Standard-normal q, k [B, N, H, D] and v [B, N, H, Dv], in that order from `generator`.
BenchInputs gaussian_inputs(const Workload& workload, std::mt19937_64& generator);

}  // namespace subquad::cli
