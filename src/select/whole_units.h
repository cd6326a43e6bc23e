// Eviction in whole units for codecs whose units group several tokens (KIVI keys, int4 groups
// longer than a row). The cache can keep any tokens of such a head, but a unit that loses some
// of its tokens must be encoded again from its decoded values, and at 2 bits that re-rounding
// compounds over many evictions. A keep list in which every encoded unit is kept whole or
// dropped whole moves the kept units as bytes, exactly (KvCache::RetainTokens). This rounds a
// policy's keep list to that form, within the same number of tokens.
#pragma once

#include <span>
#include <vector>

namespace kvstack {

// `keep`: a policy's keep list for one kv head (ascending, distinct). Tokens [0, encoded_end)
// are encoded in units of `period` tokens (encoded_end a multiple of period); later tokens are
// F32 and keep their per-token choice. The units holding the first `num_sinks` tokens (which
// must be kept) are kept; then, while whole units fit in keep.size() tokens beside the kept F32
// tokens, the units of which the policy kept the most tokens (the newer on ties). Returns
// `keep` unchanged when its encoded units are already whole or dropped, or when the sinks'
// units and the F32 tokens alone would exceed keep.size() (the cache then re-encodes).
// The result is ascending, holds at most keep.size() tokens, and keeps every F32 token and
// every sink of `keep`. period >= 1, encoded_end >= 0 (CHECKed).
std::vector<int> KeepWholeUnits(std::span<const int> keep, int encoded_end, int period,
                                int num_sinks);

}  // namespace kvstack
