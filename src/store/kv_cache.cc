// KvCache: one implementation behind the three layouts. Every layout is "blocks from one
// BlockPool plus a per-sequence block table"; they differ only in how big a block is and when
// blocks are taken:
//   paged       blocks of config.block_size slots, taken as the sequence grows;
//   contiguous  one block of `capacity` slots per sequence, taken by AddSequence;
//   ring        as contiguous, but appends wrap and first_slot moves past the oldest tokens.
// So the slot arithmetic lives in exactly one place, KvLayerView::ForEachRun, which both the
// attention kernels and Write() go through.
#include "kvstack/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kvstack/check.h"

namespace kvstack {
namespace {

constexpr size_t kArenaAlignment = 64;
constexpr size_t kMaxReservedBytes = size_t{64} << 30;  // 64 GiB: beyond that it is a typo

struct ArenaFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using ArenaPtr = std::unique_ptr<std::byte[], ArenaFree>;

// One arena of one layer: [num_blocks][num_kv_heads][block_size][unit_bytes], zeroed so that
// unwritten rows decode to zeros rather than garbage (and NaNs) in every codec.
absl::StatusOr<ArenaPtr> AllocateArena(size_t bytes) {
  const size_t rounded = (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kArenaAlignment, rounded));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv cache: could not allocate an arena of ", rounded, " bytes"));
  }
  std::memset(p, 0, rounded);
  return ArenaPtr(p);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

struct KvCache::Impl {
  struct Sequence {
    std::vector<BlockId> block_table;  // physical blocks in logical order
    int num_tokens = 0;
    int first_slot = 0;  // ring only; 0 for the other layouts
  };
  struct Layer {
    ArenaPtr k;
    ArenaPtr v;
  };

  KvCacheOptions options;
  std::unique_ptr<Codec> k_codec;
  std::unique_ptr<Codec> v_codec;
  int block_size = 0;  // slots per block: config.block_size (paged) or capacity (others)
  size_t k_block_stride = 0;
  size_t v_block_stride = 0;
  BlockPool pool;
  std::vector<Layer> layers;
  absl::flat_hash_map<SeqId, Sequence> sequences;
  // Ids are never reused, so a plan or view of a removed sequence cannot silently apply to a
  // newer one.
  SeqId next_seq_id = 0;

  explicit Impl(int32_t num_blocks) : pool(num_blocks) {}

  bool paged() const { return options.config.layout == LayoutKind::kPaged; }

  const Sequence& Seq(SeqId seq_id) const {
    auto it = sequences.find(seq_id);
    KVS_CHECK(it != sequences.end());
    return it->second;
  }

  KvArenaView ArenaView(const ArenaPtr& arena, const Codec& codec, size_t block_stride) const {
    return KvArenaView{.base = arena.get(),
                       .block_stride = block_stride,
                       .head_stride = static_cast<size_t>(block_size) * codec.unit_bytes(),
                       .unit_bytes = codec.unit_bytes(),
                       .group_tokens = codec.group_tokens(),
                       .codec = codec.id(),
                       .codec_impl = &codec};
  }

  // Copies block `src` over block `dst` in every layer, keys and values.
  void CopyBlock(BlockId src, BlockId dst) {
    for (Layer& layer : layers) {
      std::memcpy(layer.k.get() + dst * k_block_stride, layer.k.get() + src * k_block_stride,
                  k_block_stride);
      std::memcpy(layer.v.get() + dst * v_block_stride, layer.v.get() + src * v_block_stride,
                  v_block_stride);
    }
  }

  SeqId Insert(Sequence seq) {
    const SeqId seq_id = next_seq_id++;
    sequences.emplace(seq_id, std::move(seq));
    return seq_id;
  }

  absl::StatusOr<BlockId> AllocateRegion() {
    absl::StatusOr<BlockId> block = pool.Allocate();
    if (!block.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "kv cache: all ", options.config.max_sequences,
          " sequence regions are in use (max_sequences=", options.config.max_sequences, ")"));
    }
    return block;
  }
};

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
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> k_codec,
                       CreateCodec(config.k_codec, options.head_dim, CodecRole::kKey));
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> v_codec,
                       CreateCodec(config.v_codec, options.head_dim, CodecRole::kValue));

  // Sizes are checked in 128-bit arithmetic: a capacity typo must give a message, not a wrap.
  using Wide = unsigned __int128;
  const bool paged = config.layout == LayoutKind::kPaged;
  const Wide block_size = paged ? static_cast<Wide>(config.block_size) : config.capacity;
  const Wide num_blocks =
      paged ? (static_cast<Wide>(config.capacity) * config.max_sequences + block_size - 1) /
                  block_size
            : static_cast<Wide>(config.max_sequences);
  const Wide total_slots = num_blocks * block_size;
  const Wide reserved = total_slots * options.num_layers * options.num_kv_heads *
                        (k_codec->unit_bytes() + v_codec->unit_bytes());
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
  impl->block_size = static_cast<int>(block_size);
  impl->k_block_stride = options.num_kv_heads * impl->block_size * k_codec->unit_bytes();
  impl->v_block_stride = options.num_kv_heads * impl->block_size * v_codec->unit_bytes();
  impl->k_codec = std::move(k_codec);
  impl->v_codec = std::move(v_codec);
  impl->layers.resize(options.num_layers);
  for (Impl::Layer& layer : impl->layers) {
    const size_t num_arena_blocks = static_cast<size_t>(num_blocks);
    KVS_ASSIGN_OR_RETURN(layer.k, AllocateArena(num_arena_blocks * impl->k_block_stride));
    KVS_ASSIGN_OR_RETURN(layer.v, AllocateArena(num_arena_blocks * impl->v_block_stride));
  }
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
  child.first_slot = parent.first_slot;
  if (impl_->paged()) {
    // Full blocks never change again (appends only go past them), so sharing them is safe; the
    // partial tail will receive the next tokens of both sequences, so each needs its own.
    const size_t num_full = static_cast<size_t>(parent.num_tokens / impl_->block_size);
    child.block_table.assign(parent.block_table.begin(), parent.block_table.begin() + num_full);
    if (num_full < parent.block_table.size()) {
      absl::StatusOr<BlockId> tail = impl_->pool.Allocate();
      if (!tail.ok()) {
        return absl::ResourceExhaustedError(absl::StrCat("kv cache: cannot fork sequence ", seq_id,
                                                         ": no free block for its partial tail"));
      }
      impl_->CopyBlock(parent.block_table[num_full], *tail);
      child.block_table.push_back(*tail);
    }
    for (size_t idx = 0; idx < num_full; ++idx) impl_->pool.Ref(child.block_table[idx]);
  } else {
    KVS_ASSIGN_OR_RETURN(const BlockId block, impl_->AllocateRegion());
    impl_->CopyBlock(parent.block_table[0], block);
    child.block_table.push_back(block);
  }
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
    absl::StatusOr<BlockId> block = impl_->pool.Allocate();
    KVS_CHECK(block.ok());  // the plan checked num_free
    seq.block_table.push_back(*block);
  }
  if (impl_->options.config.layout == LayoutKind::kRing) {
    const int capacity = impl_->block_size;
    seq.num_tokens = std::min(seq.num_tokens + plan.num_new_tokens, capacity);
    seq.first_slot = (seq.first_slot + plan.tokens_dropped) % capacity;
  } else {
    seq.num_tokens += plan.num_new_tokens;
  }
  return absl::OkStatus();
}

void KvCache::Write(SeqId seq_id, int layer_idx, int logical_begin, std::span<const float> k,
                    std::span<const float> v) {
  const KvLayerView view = View(seq_id, layer_idx);
  const size_t token_floats = static_cast<size_t>(view.num_kv_heads) * view.head_dim;
  KVS_CHECK(k.size() == v.size() && k.size() % token_floats == 0);
  const int num_tokens = static_cast<int>(k.size() / token_floats);
  KVS_CHECK(logical_begin >= 0 && logical_begin + num_tokens <= view.num_tokens);

  // The view is the read side; its const base and this layer's mutable arena are the same
  // bytes, so offsets computed through the view address the arena.
  Impl::Layer& layer = impl_->layers[layer_idx];
  const Codec& k_codec = *impl_->k_codec;
  const Codec& v_codec = *impl_->v_codec;
  const size_t head_dim = view.head_dim;
  view.ForEachRun(
      logical_begin, logical_begin + num_tokens,
      [&](int run_begin, int count, int32_t block_id, int row_begin) {
        // Shared (forked) blocks are full and never rewritten; writing one would change the other
        // sequence's history.
        KVS_DCHECK(impl_->pool.ref_count(block_id) == 1);
        for (int t = 0; t < count; ++t) {
          const size_t src_token =
              static_cast<size_t>(run_begin + t - logical_begin) * token_floats;
          for (int h = 0; h < view.num_kv_heads; ++h) {
            const size_t src = src_token + h * head_dim;
            const size_t k_off = view.k.Row(block_id, row_begin + t, h) - view.k.base;
            const size_t v_off = view.v.Row(block_id, row_begin + t, h) - view.v.base;
            k_codec.Encode(k.subspan(src, head_dim), {layer.k.get() + k_off, view.k.unit_bytes});
            v_codec.Encode(v.subspan(src, head_dim), {layer.v.get() + v_off, view.v.unit_bytes});
          }
        }
      });
}

KvLayerView KvCache::View(SeqId seq_id, int layer_idx) const {
  KVS_CHECK(layer_idx >= 0 && layer_idx < num_layers());
  const Impl::Sequence& seq = impl_->Seq(seq_id);
  const Impl::Layer& layer = impl_->layers[layer_idx];
  return KvLayerView{
      .k = impl_->ArenaView(layer.k, *impl_->k_codec, impl_->k_block_stride),
      .v = impl_->ArenaView(layer.v, *impl_->v_codec, impl_->v_block_stride),
      .block_table = seq.block_table,
      .block_size = impl_->block_size,
      .first_slot = seq.first_slot,
      .num_tokens = seq.num_tokens,
      .num_kv_heads = impl_->options.num_kv_heads,
      .head_dim = impl_->options.head_dim,
  };
}

int KvCache::NumTokens(SeqId seq_id) const { return impl_->Seq(seq_id).num_tokens; }

const KvConfig& KvCache::config() const { return impl_->options.config; }
const Codec& KvCache::k_codec() const { return *impl_->k_codec; }
const Codec& KvCache::v_codec() const { return *impl_->v_codec; }
int KvCache::num_layers() const { return impl_->options.num_layers; }

size_t KvCache::bytes_per_token() const {
  return static_cast<size_t>(impl_->options.num_layers) * impl_->options.num_kv_heads *
         (impl_->k_codec->unit_bytes() + impl_->v_codec->unit_bytes());
}

size_t KvCache::bytes_reserved() const {
  return static_cast<size_t>(impl_->pool.num_blocks()) * impl_->options.num_layers *
         (impl_->k_block_stride + impl_->v_block_stride);
}

size_t KvCache::bytes_in_use() const {
  const size_t num_used = impl_->pool.num_blocks() - impl_->pool.num_free();
  return num_used * impl_->options.num_layers * (impl_->k_block_stride + impl_->v_block_stride);
}

const BlockPool& KvCache::pool() const { return impl_->pool; }

}  // namespace kvstack
