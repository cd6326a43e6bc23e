// KvCache: one implementation behind the three layouts. Every layout is "blocks from one
// BlockPool plus a per-sequence block table"; they differ only in how big a block is and when
// blocks are taken:
//   paged       blocks of config.block_size slots, taken as the sequence grows;
//   contiguous  one block of `capacity` slots per sequence, taken by AddSequence;
//   ring        as contiguous, but appends wrap and first_slot moves past the oldest tokens.
// So the slot arithmetic lives in exactly one place, KvLayerView's BlockIndexAndRow (under
// RunAt, ForEachRun and ArenaRunAt), which both the attention kernels and Write() go through.
// Next to the arenas each sequence has, per layer, F32 side buffers: the sink tokens
// (config.sink_tokens) and, for codecs whose units hold several tokens, the unit still filling
// ("pending"). This file creates the cache and manages sequences and accounting; Write() and
// View(), which know the segments, are in kv_cache_rows.cc; eviction (RetainTokens) is in
// kv_cache_evict.cc.
#include "kvstack/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/large_buffer.h"
#include "kvstack/check.h"
#include "kvstack/kv_profile.h"
#include "represent/codec_name.h"
#include "represent/hadamard.h"
#include "represent/latent_codec.h"
#include "represent/lowrank_codec.h"
#include "store/kv_cache_impl.h"

namespace kvstack {
namespace {

constexpr size_t kArenaAlignment = 64;
constexpr size_t kMaxReservedBytes = size_t{64} << 30;  // 64 GiB: beyond that it is a typo

// One arena of one layer: [num_kv_heads][num_blocks][units of a block], zeroed so that
// unwritten rows decode to zeros rather than garbage (and NaNs) in every codec.
absl::StatusOr<ArenaPtr> AllocateArena(size_t bytes) {
  size_t rounded = 0;
  auto* p = static_cast<std::byte*>(AllocateLargeBuffer(bytes, kArenaAlignment, &rounded));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv cache: could not allocate an arena of ", rounded, " bytes"));
  }
  std::memset(p, 0, rounded);
  return ArenaPtr(p);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of one kv head's units of `codec` in one block of `block_size` token slots, in the
// caller's arithmetic (Create checks sizes in 128 bits before it allocates).
template <typename Int>
Int HeadBlockBytes(const Codec& codec, Int block_size) {
  return block_size / static_cast<Int>(codec.group_tokens()) * static_cast<Int>(codec.unit_bytes());
}

// The one-head arenas of one side of a layer, [num_kv_heads]: head h read with codecs[h], its
// region of `base` laid out by layouts[h] (the codec whose units it holds: the key codec for a
// joint layer's values), after the regions of heads 0..h-1. Head-major: a sequence's blocks,
// allocated in order from a fresh pool, give each kv head one contiguous run of bytes, which
// decode reads much faster than 4 KiB pieces a block apart (bf16, 64k tokens, 2 threads on
// Zen 4: 16-17 instead of 24-31 ms per step; docs/representation-speed.md). head_stride is a
// head's region: the distance to the next head's when that one has the same codecs.
std::vector<KvArenaView> HeadArenas(const std::byte* base, std::span<const Codec* const> codecs,
                                    std::span<const Codec* const> layouts, int block_size,
                                    int32_t num_blocks) {
  std::vector<KvArenaView> heads;
  size_t offset = 0;
  for (size_t h = 0; h < codecs.size(); ++h) {
    const Codec& codec = *codecs[h];
    const size_t block_bytes = HeadBlockBytes(*layouts[h], static_cast<size_t>(block_size));
    const size_t region_bytes = static_cast<size_t>(num_blocks) * block_bytes;
    heads.push_back(KvArenaView{.base = base + offset,
                                .block_stride = block_bytes,
                                .head_stride = region_bytes,
                                .unit_bytes = codec.unit_bytes(),
                                .group_tokens = codec.group_tokens(),
                                .codec = codec.id(),
                                .codec_impl = &codec});
    offset += region_bytes;
  }
  return heads;
}

using CodecFactory = std::function<absl::StatusOr<std::unique_ptr<Codec>>(
    std::string_view name, int head_dim, CodecRole role)>;

}  // namespace

namespace {

// The period of a layer whose kv heads' key and value codecs are `codecs`: tokens that stay
// pending until their units fill. Checks that the units fit the layout.
absl::StatusOr<int> UnitPeriod(std::span<const Codec* const> codecs, const KvConfig& config,
                               int layer_idx) {
  const Codec& wide = **std::max_element(codecs.begin(), codecs.end(), [](auto* a, auto* b) {
    return a->group_tokens() < b->group_tokens();
  });
  const int period = wide.group_tokens();
  for (const Codec* narrow : codecs) {
    if (period % narrow->group_tokens() == 0) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: layer ", layer_idx, ": codec '", std::string(wide.name()), "' groups ", period,
        " tokens and codec '", std::string(narrow->name()), "' groups ", narrow->group_tokens(),
        "; allowed: unit sizes of which one is a multiple of the other"));
  }
  if (period > 1 && config.layout == LayoutKind::kRing) {
    // A ring overwrites its oldest slot one token at a time, which would leave a unit half old
    // and half new.
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: the ring layout needs one-token units; codec '", std::string(wide.name()),
        "' groups ", period, " tokens (layer ", layer_idx, ")"));
  }
  if (config.layout == LayoutKind::kPaged && config.block_size > 0 &&
      config.block_size % period != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: block_size ", config.block_size, " is not a multiple of the ",
                     period, "-token units of codec '", std::string(wide.name()), "' (layer ",
                     layer_idx, "); allowed: a multiple of ", period));
  }
  if (config.recent_tokens % period != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: recent_tokens ", config.recent_tokens, " is not a multiple of the ",
                     period, "-token units of codec '", std::string(wide.name()), "' (layer ",
                     layer_idx, "); allowed: a multiple of ", period));
  }
  if (config.recent_tokens > 0 && config.layout == LayoutKind::kRing) {
    return absl::InvalidArgumentError(
        "kv cache: recent_tokens needs the contiguous or paged layout, not the ring");
  }
  return period;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheOptions& options) {
  if (options.num_layers < 1 || options.num_kv_heads < 1 || options.head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: num_layers (", options.num_layers, "), num_kv_heads (", options.num_kv_heads,
        ") and head_dim (", options.head_dim, ") must all be >= 1"));
  }
  const KvConfig& config = options.config;
  KVS_RETURN_IF_ERROR(ValidateKvConfig(config));
  if (config.capacity <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: capacity is ", config.capacity,
                     "; capacity must be resolved to > 0 before creating the cache"));
  }
  for (const KvConfig::LayerCodecs& entry : config.layer_codecs) {
    if (entry.layer_idx >= options.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv cache: layer_codecs names layer ", entry.layer_idx, " but num_layers is ",
          options.num_layers, "; allowed: layers 0..", options.num_layers - 1));
    }
  }
  for (const KvConfig::HeadCodecs& entry : config.head_codecs) {
    if (entry.layer_idx >= options.num_layers || entry.kv_head >= options.num_kv_heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv cache: head_codecs names kv head ", entry.kv_head, " of layer ",
                       entry.layer_idx, " but the model has ", options.num_layers, " layers of ",
                       options.num_kv_heads, " kv heads; allowed: layers 0..",
                       options.num_layers - 1, ", kv heads 0..", options.num_kv_heads - 1));
    }
  }
  if (config.hadamard_keys && !IsPowerOfTwo(options.head_dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: hadamard_keys needs head_dim a power of two; head_dim is ", options.head_dim));
  }
  if (config.layout == LayoutKind::kRing && config.sink_tokens >= config.capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: sink_tokens ", config.sink_tokens, " leaves no room in a ring of capacity ",
        config.capacity, "; allowed: sink_tokens < capacity"));
  }

  // Low-rank codecs are built from the calibration profile, loaded once for all layers.
  std::optional<KvProfile> profile;
  bool any_low_rank = false;
  for (int layer_idx = 0; layer_idx < options.num_layers; ++layer_idx) {
    for (int h = 0; h < options.num_kv_heads; ++h) {
      any_low_rank = any_low_rank || IsLowRankCodecName(config.KCodecOf(layer_idx, h)) ||
                     IsLowRankCodecName(config.VCodecOf(layer_idx, h));
    }
  }
  if (any_low_rank) {
    if (config.profile.empty()) {
      return absl::InvalidArgumentError(
          "kv cache: low-rank codecs need a calibration profile: give --profile (kvstack "
          "calibrate writes one)");
    }
    KVS_ASSIGN_OR_RETURN(profile,
                         KvProfile::Load(config.profile, options.model_hash, options.num_layers,
                                         options.num_kv_heads, options.head_dim));
  }
  const CodecFactory registry = options.codec_factory ? options.codec_factory : CreateCodec;
  auto make_codec = [&](const std::string& name, int layer_idx,
                        CodecRole role) -> absl::StatusOr<std::unique_ptr<Codec>> {
    if (!IsLowRankCodecName(name)) return registry(name, options.head_dim, role);
    return CreateProfiledCodec(name, *profile, layer_idx, role);
  };
  auto check_key_codec = [&](const std::string& name, int layer_idx) -> absl::Status {
    if (!config.hadamard_keys || !IsLowRankCodecName(name)) return absl::OkStatus();
    // The rotation would put keys in another basis than the calibrated one, and gains
    // nothing: a PCA basis turns with the keys.
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: hadamard_keys with key codec '", name, "' (layer ", layer_idx,
        "): its basis was calibrated on unrotated keys; allowed: hadamard_keys with key codecs "
        "that need no profile"));
  };
  std::vector<Impl::Layer> layers(options.num_layers);
  // Each kv head's codecs per layer, [num_layers][num_kv_heads]: the layer's, or its override's.
  std::vector<std::vector<const Codec*>> k_of_head(options.num_layers),
      v_of_head(options.num_layers);
  int64_t period_lcm = 1;  // every layer's units must fit a contiguous region
  for (int layer_idx = 0; layer_idx < options.num_layers; ++layer_idx) {
    Impl::Layer& layer = layers[layer_idx];
    KVS_RETURN_IF_ERROR(CheckLatentPair(config.KCodecOf(layer_idx), config.VCodecOf(layer_idx)));
    KVS_ASSIGN_OR_RETURN(layer.k_codec,
                         make_codec(config.KCodecOf(layer_idx), layer_idx, CodecRole::kKey));
    KVS_ASSIGN_OR_RETURN(layer.v_codec,
                         make_codec(config.VCodecOf(layer_idx), layer_idx, CodecRole::kValue));
    // Heads naming the same codec for the same side share one (the layer's, if it is that):
    // heads that share codecs are read together (KvLayerView::SameHeads).
    std::vector<std::pair<CodecRole, const Codec*>> side_codecs = {
        {CodecRole::kKey, layer.k_codec.get()}, {CodecRole::kValue, layer.v_codec.get()}};
    auto head_codec = [&](const std::string& name, CodecRole role) -> absl::StatusOr<const Codec*> {
      // Compared by the name a codec reports, which spells out the defaults ("int4" is
      // "int4-g32"): an alias is the same codec, not a per-head one.
      const absl::StatusOr<CodecName> parsed = ParseCodecName(name);
      const std::string reported = parsed.ok() ? parsed->canonical() : name;
      for (const auto& [side, codec] : side_codecs) {
        if (side == role && codec->name() == reported) return codec;
      }
      KVS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, make_codec(name, layer_idx, role));
      layer.head_codecs.push_back(std::move(codec));
      side_codecs.emplace_back(role, layer.head_codecs.back().get());
      return layer.head_codecs.back().get();
    };
    std::vector<const Codec*> all_codecs;
    for (int h = 0; h < options.num_kv_heads; ++h) {
      KVS_RETURN_IF_ERROR(check_key_codec(config.KCodecOf(layer_idx, h), layer_idx));
      KVS_ASSIGN_OR_RETURN(const Codec* k,
                           head_codec(config.KCodecOf(layer_idx, h), CodecRole::kKey));
      KVS_ASSIGN_OR_RETURN(const Codec* v,
                           head_codec(config.VCodecOf(layer_idx, h), CodecRole::kValue));
      k_of_head[layer_idx].push_back(k);
      v_of_head[layer_idx].push_back(v);
      all_codecs.insert(all_codecs.end(), {k, v});
      layer.mixed = layer.mixed || k != k_of_head[layer_idx][0] || v != v_of_head[layer_idx][0];
    }
    KVS_ASSIGN_OR_RETURN(layer.period, UnitPeriod(all_codecs, config, layer_idx));
    period_lcm = std::lcm(period_lcm, int64_t{layer.period});
  }

  // Sizes are checked in 128-bit arithmetic: a capacity typo must give a message, not a wrap.
  using Wide = unsigned __int128;
  const bool paged = config.layout == LayoutKind::kPaged;
  // block_size 0: 16 tokens, or the smallest multiple of every layer's period above that.
  const Wide lcm = static_cast<Wide>(period_lcm);
  const Wide config_block_size = config.block_size > 0
                                     ? static_cast<Wide>(config.block_size)
                                     : (Wide{kDefaultBlockSize} + lcm - 1) / lcm * lcm;
  if (paged && config_block_size > static_cast<Wide>(kMaxBlockSize)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: the codecs' token units need blocks of ",
                     static_cast<int64_t>(config_block_size), " tokens; allowed: at most ",
                     kMaxBlockSize, " (choose smaller groups)"));
  }
  // Region layouts round the region up to whole periods of every layer.
  const Wide block_size =
      paged ? config_block_size : (static_cast<Wide>(config.capacity) + lcm - 1) / lcm * lcm;
  const Wide num_blocks =
      paged ? (static_cast<Wide>(config.capacity) * config.max_sequences + block_size - 1) /
                  block_size
            : static_cast<Wide>(config.max_sequences);
  const Wide total_slots = num_blocks * block_size;
  Wide block_bytes = 0;  // one block in every layer and kv head, keys and values
  for (int layer_idx = 0; layer_idx < options.num_layers; ++layer_idx) {
    for (int h = 0; h < options.num_kv_heads; ++h) {
      block_bytes += HeadBlockBytes(*k_of_head[layer_idx][h], block_size);
      if (layers[layer_idx].joint()) continue;
      block_bytes += HeadBlockBytes(*v_of_head[layer_idx][h], block_size);
    }
  }
  const Wide reserved = num_blocks * block_bytes;
  if (reserved > kMaxReservedBytes || total_slots > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: ", config.ToString(), " with num_layers=", options.num_layers,
        " num_kv_heads=", options.num_kv_heads, " head_dim=", options.head_dim, " needs ",
        static_cast<double>(reserved) / (1 << 30), " GiB in ", static_cast<double>(total_slots),
        " token slots; allowed: at most ", kMaxReservedBytes >> 30,
        " GiB and 2^31-1 slots (lower capacity or max_sequences)"));
  }

  auto impl = std::make_unique<Impl>(static_cast<int32_t>(num_blocks));
  impl->options = options;
  impl->options.config.block_size = static_cast<int>(config_block_size);
  impl->block_size = static_cast<int>(block_size);
  for (int layer_idx = 0; layer_idx < options.num_layers; ++layer_idx) {
    Impl::Layer& layer = layers[layer_idx];
    const auto arena_bytes = [&](std::span<const Codec* const> codecs) {
      size_t bytes = 0;
      for (const Codec* codec : codecs) {
        bytes += HeadBlockBytes(*codec, static_cast<size_t>(impl->block_size));
      }
      return bytes * static_cast<size_t>(num_blocks);
    };
    KVS_ASSIGN_OR_RETURN(layer.k, AllocateArena(arena_bytes(k_of_head[layer_idx])));
    layer.k_heads = HeadArenas(layer.k.get(), k_of_head[layer_idx], k_of_head[layer_idx],
                               impl->block_size, impl->pool.num_blocks());
    if (layer.joint()) {
      // The values are read from the key units: the key arena's layout, the value codec.
      layer.v_heads = HeadArenas(layer.k.get(), v_of_head[layer_idx], k_of_head[layer_idx],
                                 impl->block_size, impl->pool.num_blocks());
    } else {
      KVS_ASSIGN_OR_RETURN(layer.v, AllocateArena(arena_bytes(v_of_head[layer_idx])));
      layer.v_heads = HeadArenas(layer.v.get(), v_of_head[layer_idx], v_of_head[layer_idx],
                                 impl->block_size, impl->pool.num_blocks());
    }
  }
  impl->layers = std::move(layers);
  return std::unique_ptr<KvCache>(new KvCache(std::move(impl)));
}

KvCache::KvCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCache::~KvCache() = default;

absl::StatusOr<SeqId> KvCache::AddSequence() {
  Impl::Sequence seq;
  // Paged sequences start empty and grow block by block; the others own one region for life.
  if (!impl_->paged()) {
    KVS_ASSIGN_OR_RETURN(const BlockId block, impl_->AllocateRegion());
    seq.block_table.push_back(block);
  }
  seq.layers = impl_->NewSideBuffers();
  return impl_->Insert(std::move(seq));
}

absl::Status KvCache::RemoveSequence(SeqId seq_id) {
  auto it = impl_->sequences.find(seq_id);
  if (it == impl_->sequences.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: no sequence with id ", seq_id));
  }
  for (const BlockId block : it->second.block_table) impl_->pool.Unref(block);
  impl_->sequences.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<SeqId> KvCache::ForkSequence(SeqId seq_id) {
  auto it = impl_->sequences.find(seq_id);
  if (it == impl_->sequences.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: no sequence with id ", seq_id));
  }
  const Impl::Sequence& parent = it->second;
  Impl::Sequence child;
  child.num_tokens = parent.num_tokens;
  child.head_tokens = parent.head_tokens;
  child.first_slot = parent.first_slot;
  child.num_appended = parent.num_appended;
  if (impl_->paged()) {
    // Blocks that every head has filled with encoded units never change again (appends only
    // go past them), so sharing them is safe; the rest will receive the next tokens or units of
    // both sequences (a head that kept fewer tokens after an eviction appends inside earlier
    // blocks, and pending tokens are encoded later), so each sequence needs its own.
    // RetainTokens copies shared blocks before it moves rows.
    const size_t num_full =
        static_cast<size_t>(impl_->MinEncodedTokens(parent) / impl_->block_size);
    const size_t num_copied = parent.block_table.size() - num_full;
    if (static_cast<int64_t>(num_copied) > impl_->pool.num_free()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("kv cache: cannot fork sequence ", seq_id, ": ", num_copied,
                       " blocks must be copied and only ", impl_->pool.num_free(), " are free"));
    }
    child.block_table.assign(parent.block_table.begin(), parent.block_table.begin() + num_full);
    for (size_t idx = 0; idx < num_full; ++idx) impl_->pool.Ref(child.block_table[idx]);
    for (size_t idx = num_full; idx < parent.block_table.size(); ++idx) {
      absl::StatusOr<BlockId> copy =
          impl_->pool.AllocateAfter(child.block_table.empty() ? -1 : child.block_table.back());
      KVS_CHECK(copy.ok());  // counted above
      impl_->CopyBlock(parent.block_table[idx], *copy);
      child.block_table.push_back(*copy);
    }
  } else {
    KVS_ASSIGN_OR_RETURN(const BlockId block, impl_->AllocateRegion());
    impl_->CopyBlock(parent.block_table[0], block);
    child.block_table.push_back(block);
  }
  // The sinks and the unit still filling are part of the history the child shares.
  child.layers = parent.layers;
  return impl_->Insert(std::move(child));
}

absl::StatusOr<AppendPlan> KvCache::PlanAppend(SeqId seq_id, int num_new_tokens) const {
  auto it = impl_->sequences.find(seq_id);
  if (it == impl_->sequences.end()) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: no sequence with id ", seq_id));
  }
  if (num_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: cannot append ", num_new_tokens, " tokens; allowed: 1 or more"));
  }
  const Impl::Sequence& seq = it->second;
  const int64_t total = int64_t{seq.num_tokens} + num_new_tokens;
  const int64_t capacity = impl_->options.config.capacity;
  AppendPlan plan{.seq_id = seq_id, .num_new_tokens = num_new_tokens};
  switch (impl_->options.config.layout) {
    case LayoutKind::kPaged: {
      const int64_t needed =
          CeilDiv(total, impl_->block_size) - static_cast<int64_t>(seq.block_table.size());
      plan.fits = needed <= impl_->pool.num_free();
      plan.blocks_needed = static_cast<int>(std::min<int64_t>(needed, impl_->pool.num_blocks()));
      break;
    }
    case LayoutKind::kContiguous:
      plan.fits = total <= capacity;
      break;
    case LayoutKind::kRing:
      plan.fits = num_new_tokens <= capacity;
      plan.tokens_dropped = static_cast<int>(std::max<int64_t>(0, total - capacity));
      break;
  }
  return plan;
}

absl::Status KvCache::CommitAppend(const AppendPlan& plan) {
  absl::StatusOr<AppendPlan> current = PlanAppend(plan.seq_id, plan.num_new_tokens);
  if (!current.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("kv cache: stale append plan: ", current.status().message()));
  }
  if (!current->fits) {
    return absl::FailedPreconditionError(absl::StrCat("kv cache: ", plan.num_new_tokens,
                                                      " new tokens do not fit in sequence ",
                                                      plan.seq_id, " (plan first)"));
  }
  // A plan that still describes exactly what the commit would do is safe to apply, whenever
  // it was made; anything else was made against another state.
  if (current->blocks_needed != plan.blocks_needed ||
      current->tokens_dropped != plan.tokens_dropped || !plan.fits) {
    return absl::FailedPreconditionError(
        absl::StrCat("kv cache: stale append plan for sequence ", plan.seq_id,
                     ": the cache changed since it was made (plan again)"));
  }
  Impl::Sequence& seq = impl_->sequences.find(plan.seq_id)->second;
  for (int idx = 0; idx < plan.blocks_needed; ++idx) {
    // Next to the sequence's last block where the pool can (BlockPool::AllocateAfter).
    absl::StatusOr<BlockId> block =
        impl_->pool.AllocateAfter(seq.block_table.empty() ? -1 : seq.block_table.back());
    KVS_CHECK(block.ok());  // the plan checked num_free
    seq.block_table.push_back(*block);
  }
  impl_->NotePeak();
  seq.num_appended += plan.num_new_tokens;
  const int old_num_tokens = seq.num_tokens;
  if (impl_->options.config.layout == LayoutKind::kRing) {
    const int capacity = impl_->block_size;
    seq.num_tokens = std::min(seq.num_tokens + plan.num_new_tokens, capacity);
    seq.first_slot = (seq.first_slot + plan.tokens_dropped) % capacity;
  } else {
    seq.num_tokens += plan.num_new_tokens;
  }
  // Every head grows by the new tokens less those the ring dropped: the ring's first_slot is
  // shared by all heads, so a head that kept fewer tokens loses its oldest ones too.
  for (int32_t& n : seq.head_tokens) n += seq.num_tokens - old_num_tokens;
  return absl::OkStatus();
}

int KvCache::NumTokens(SeqId seq_id) const { return impl_->Seq(seq_id).num_tokens; }

int KvCache::HeadTokens(SeqId seq_id, int layer_idx, int kv_head) const {
  KVS_CHECK(layer_idx >= 0 && layer_idx < num_layers());
  KVS_CHECK(kv_head >= 0 && kv_head < impl_->options.num_kv_heads);
  const Impl::Sequence& seq = impl_->Seq(seq_id);
  const std::span<const int32_t> counts = impl_->HeadTokensOf(seq, layer_idx);
  return counts.empty() ? seq.num_tokens : counts[kv_head];
}

const KvConfig& KvCache::config() const { return impl_->options.config; }
const Codec& KvCache::k_codec(int layer_idx, int kv_head) const {
  KVS_CHECK(layer_idx >= 0 && layer_idx < num_layers());
  KVS_CHECK(kv_head >= 0 && kv_head < impl_->options.num_kv_heads);
  return *impl_->layers[layer_idx].k_heads[kv_head].codec_impl;
}
const Codec& KvCache::v_codec(int layer_idx, int kv_head) const {
  KVS_CHECK(layer_idx >= 0 && layer_idx < num_layers());
  KVS_CHECK(kv_head >= 0 && kv_head < impl_->options.num_kv_heads);
  return *impl_->layers[layer_idx].v_heads[kv_head].codec_impl;
}
int KvCache::unit_period(int layer_idx) const {
  KVS_CHECK(layer_idx >= 0 && layer_idx < num_layers());
  return impl_->layers[layer_idx].period;
}
int KvCache::num_layers() const { return impl_->options.num_layers; }

double KvCache::bytes_per_token() const {
  double bytes = 0.0;
  for (const Impl::Layer& layer : impl_->layers) {
    // A joint layer's value units are its key units: counted once.
    for (const auto* side : {&layer.k_heads, &layer.v_heads}) {
      if (side == &layer.v_heads && layer.joint()) continue;
      for (const KvArenaView& head : *side) {
        bytes += static_cast<double>(head.unit_bytes) / head.group_tokens;
      }
    }
  }
  return bytes;
}

double KvCache::bits_per_element() const {
  const double elements_per_token =
      2.0 * impl_->options.num_layers * impl_->options.num_kv_heads * impl_->options.head_dim;
  return 8.0 * bytes_per_token() / elements_per_token;
}

size_t KvCache::bytes_reserved() const {
  return static_cast<size_t>(impl_->pool.num_blocks()) * impl_->BlockBytes();
}

size_t KvCache::bytes_in_use() const { return impl_->BytesInUse(); }

size_t KvCache::peak_bytes_in_use() const { return impl_->peak_bytes_in_use; }

void KvCache::ResetPeakBytesInUse() { impl_->peak_bytes_in_use = impl_->BytesInUse(); }

size_t KvCache::f32_row_bytes_in_use() const {
  return impl_->sequences.size() * impl_->SideBytesPerSequence();
}

const BlockPool& KvCache::pool() const { return impl_->pool; }

}  // namespace kvstack
