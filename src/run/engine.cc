// The Llama forward pass over kvstack's KV cache. One call runs a micro-batch of tokens of one
// sequence through every layer: the new keys and values are encoded into the cache first, then
// attention reads the whole sequence back through the layer's view, in its stored format.
// Activations live in scratch buffers sized once for max_batch tokens, so decode allocates
// nothing.
#include "kvstack/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_format.h"
#include "base/thread_pool.h"
#include "run/attention.h"
#include "run/attention_heads.h"
#include "run/dense_ops.h"
#include "run/eviction.h"
#include "run/memory_bandwidth.h"

namespace kvstack {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// Activations of one micro-batch; every buffer is [max_batch, width].
struct Engine::Scratch {
  std::vector<float> x, xn, q, k, v, attn, gate, up;
};

Engine::Engine(const LlamaModel& model, const EngineOptions& options,
               std::unique_ptr<KvCache> cache, std::unique_ptr<Evictor> evictor)
    : model_(model), options_(options), cache_(std::move(cache)), evictor_(std::move(evictor)) {
  pool_ = std::make_unique<ThreadPool>(options_.num_threads);
  const LlamaHparams& hp = model_.hparams();
  const size_t b = options_.max_batch;
  scratch_ = std::make_unique<Scratch>();
  scratch_->x.resize(b * hp.dim);
  scratch_->xn.resize(b * hp.dim);
  scratch_->q.resize(b * hp.num_heads * hp.head_dim);
  scratch_->k.resize(b * hp.num_kv_heads * hp.head_dim);
  scratch_->v.resize(b * hp.num_kv_heads * hp.head_dim);
  scratch_->attn.resize(b * hp.num_heads * hp.head_dim);
  scratch_->gate.resize(b * std::max(hp.ffn_dim, hp.dim));
  scratch_->up.resize(b * hp.ffn_dim);
}

Engine::~Engine() = default;

absl::Status Engine::SetAttentionObserver(AttentionObserver observer) {
  if (evictor_ != nullptr && observer) {
    return absl::FailedPreconditionError(
        "attention observer: the cache evicts, and its policies own the attention scores");
  }
  observer_ = std::move(observer);
  observed_scores_.assign(
      observer_ ? static_cast<size_t>(model_.hparams().num_kv_heads) * options_.kv.capacity : 0,
      0.0f);
  return absl::OkStatus();
}

double Engine::kept_fraction() const {
  return evictor_ != nullptr ? evictor_->KeptFraction(options_.context_tokens) : 1.0;
}

KvCacheOptions CacheOptionsFor(const LlamaModel& model, const KvConfig& kv) {
  const LlamaHparams& hp = model.hparams();
  KvCacheOptions options;
  options.num_layers = hp.num_layers;
  options.num_kv_heads = hp.num_kv_heads;
  options.head_dim = hp.head_dim;
  options.config = kv;
  options.model_hash = model.gguf().ContentHash();
  return options;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const LlamaModel& model,
                                                       const EngineOptions& options) {
  if (options.context_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("context_tokens must be >= 1, got %d", options.context_tokens));
  }
  if (options.num_threads < 0 || options.num_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrFormat("threads must be 0 (all) or 1..1024, got %d", options.num_threads));
  }
  if (options.max_batch < 1 || options.max_batch > kMaxEngineBatch) {
    return absl::InvalidArgumentError(
        absl::StrFormat("batch must be 1..%d, got %d", kMaxEngineBatch, options.max_batch));
  }
  EngineOptions resolved = options;
  KVS_RETURN_IF_ERROR(ValidateKvConfig(resolved.kv));
  std::unique_ptr<Evictor> evictor;
  if (resolved.kv.evicts()) {
    KVS_ASSIGN_OR_RETURN(evictor, CreateEvictor(model, resolved));
  } else if (resolved.kv.capacity == 0) {
    resolved.kv.capacity = options.context_tokens;
  }
  if (resolved.kv.layout == LayoutKind::kRing) {
    // A forward call must not overwrite its own tokens in the ring.
    resolved.max_batch =
        static_cast<int>(std::min<int64_t>(resolved.max_batch, resolved.kv.capacity));
  }
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                       KvCache::Create(CacheOptionsFor(model, resolved.kv)));
  resolved.kv.block_size = cache->config().block_size;
  return std::unique_ptr<Engine>(new Engine(model, resolved, std::move(cache), std::move(evictor)));
}

// The evictor of an evicting configuration, and the cache capacity it needs: what the policy
// keeps per head plus one forward call's tokens. Byte budgets are resolved with the token
// size of a small cache of the same design.
absl::StatusOr<std::unique_ptr<Evictor>> Engine::CreateEvictor(const LlamaModel& model,
                                                               EngineOptions& resolved) {
  KvConfig probe_config = resolved.kv;
  // (With block_size 0 the probe sizes its own blocks; 64 tokens fill at least part of one.)
  probe_config.capacity = std::max(probe_config.block_size, 64);
  probe_config.max_sequences = 1;
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> probe,
                       KvCache::Create(CacheOptionsFor(model, probe_config)));
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Evictor> evictor,
                       Evictor::Create(model.hparams(), model.gguf().ContentHash(), resolved.kv,
                                       resolved.context_tokens, probe->bytes_per_token()));
  const int64_t needed = std::min<int64_t>(
      resolved.context_tokens, static_cast<int64_t>(evictor->MaxHeadTokens()) +
                                   std::min(resolved.max_batch, resolved.context_tokens));
  if (resolved.kv.capacity == 0) {
    resolved.kv.capacity = needed;
  } else if (resolved.kv.capacity < needed) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "capacity %d cannot hold the policy's %d tokens per head plus one forward call's %d; "
        "allowed: capacity >= %d (or 0 to size it)",
        resolved.kv.capacity, evictor->MaxHeadTokens(), resolved.max_batch, needed));
  }
  return evictor;
}

absl::StatusOr<SeqId> Engine::NewSequence() {
  KVS_ASSIGN_OR_RETURN(SeqId seq_id, cache_->AddSequence());
  if (static_cast<size_t>(seq_id) >= next_pos_.size()) next_pos_.resize(seq_id + 1, 0);
  next_pos_[seq_id] = 0;
  if (evictor_ != nullptr) {
    evictor_->AddSequence(seq_id, static_cast<int>(options_.kv.capacity));
  }
  return seq_id;
}

absl::Status Engine::FreeSequence(SeqId seq_id) {
  KVS_RETURN_IF_ERROR(cache_->RemoveSequence(seq_id));
  if (evictor_ != nullptr) evictor_->RemoveSequence(seq_id);
  return absl::OkStatus();
}

int Engine::NextPosition(SeqId seq_id) const {
  KVS_CHECK(seq_id >= 0 && static_cast<size_t>(seq_id) < next_pos_.size());
  return next_pos_[seq_id];
}

absl::Status Engine::Forward(SeqId seq_id, std::span<const TokenId> tokens, bool all_logits,
                             std::vector<float>* logits) {
  if (tokens.empty()) return absl::InvalidArgumentError("forward: no tokens");
  if (seq_id < 0 || static_cast<size_t>(seq_id) >= next_pos_.size()) {
    return absl::NotFoundError(absl::StrFormat("forward: unknown sequence %d", seq_id));
  }
  const int vocab = model_.hparams().vocab_size;
  for (TokenId t : tokens) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token id %d is outside the vocabulary [0, %d)", t, vocab));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const size_t n = tokens.size();
  logits->resize((all_logits ? n : 1) * static_cast<size_t>(vocab));
  for (size_t begin = 0; begin < n; begin += options_.max_batch) {
    const size_t count = std::min<size_t>(options_.max_batch, n - begin);
    const bool last_batch = begin + count == n;
    float* out = nullptr;
    if (all_logits) {
      out = logits->data() + begin * vocab;
    } else if (last_batch) {
      out = logits->data();
    }
    KVS_RETURN_IF_ERROR(ForwardBatch(seq_id, tokens.subspan(begin, count), all_logits, out));
  }
  profile_.total_seconds += SecondsSince(start);
  return absl::OkStatus();
}

absl::Status Engine::ForwardBatch(SeqId seq_id, std::span<const TokenId> tokens, bool all_logits,
                                  float* logits) {
  const LlamaHparams& hp = model_.hparams();
  const int m = static_cast<int>(tokens.size());
  KVS_ASSIGN_OR_RETURN(AppendPlan plan, cache_->PlanAppend(seq_id, m));
  if (!plan.fits) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV cache full: sequence %d holds %d tokens and %d more do not fit (%s); raise the "
        "capacity",
        seq_id, cache_->NumTokens(seq_id), m, cache_->config().ToString()));
  }
  KVS_RETURN_IF_ERROR(cache_->CommitAppend(plan));
  const int pos0 = next_pos_[seq_id];
  next_pos_[seq_id] += m;

  Scratch& s = *scratch_;
  const int dim = hp.dim;
  const int q_width = hp.num_heads * hp.head_dim;
  const int kv_width = hp.num_kv_heads * hp.head_dim;
  ThreadPool* pool = pool_.get();

  for (int t = 0; t < m; ++t) ops::EmbeddingRow(model_.token_embedding(), tokens[t], &s.x[t * dim]);

  AttentionParams attention_params;
  attention_params.num_heads = hp.num_heads;
  attention_params.scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim));

  for (int layer_idx = 0; layer_idx < hp.num_layers; ++layer_idx) {
    const LlamaLayerWeights& w = model_.layer(layer_idx);
    // Attention block: x += Wo * Attention(RoPE(Wq xn), cache + RoPE(Wk xn), cache + Wv xn).
    for (int t = 0; t < m; ++t) {
      ops::RmsNorm(&s.x[t * dim], w.attn_norm.data(), dim, hp.rms_eps, &s.xn[t * dim]);
    }
    ops::MatMul(w.wq, s.xn.data(), m, s.q.data(), pool);
    ops::MatMul(w.wk, s.xn.data(), m, s.k.data(), pool);
    ops::MatMul(w.wv, s.xn.data(), m, s.v.data(), pool);
    // Positions are the tokens' own unless the policy re-assigns them per layer.
    const int layer_pos0 =
        evictor_ != nullptr ? evictor_->NextPosition(seq_id, layer_idx, pos0) : pos0;
    for (int t = 0; t < m; ++t) {
      ops::Rope(&s.q[t * q_width], hp.num_heads, hp.head_dim, hp.rope_dim, layer_pos0 + t,
                hp.rope_freq_base, hp.rope_style);
      ops::Rope(&s.k[t * kv_width], hp.num_kv_heads, hp.head_dim, hp.rope_dim, layer_pos0 + t,
                hp.rope_freq_base, hp.rope_style);
    }
    // Re-read per layer: an eviction in an earlier layer may have lowered NumTokens (the new
    // tokens are always the last m of it).
    cache_->Write(seq_id, layer_idx, cache_->NumTokens(seq_id) - m,
                  std::span<const float>(s.k.data(), static_cast<size_t>(m) * kv_width),
                  std::span<const float>(s.v.data(), static_cast<size_t>(m) * kv_width));
    const AttentionScores* scores =
        evictor_ != nullptr ? evictor_->BeginLayerStep(seq_id, layer_idx, layer_pos0, m, m)
                            : nullptr;
    AttentionScores observed;
    if (observer_) {
      std::fill(observed_scores_.begin(), observed_scores_.end(), 0.0f);
      observed = {.out = observed_scores_.data(),
                  .stride = static_cast<int>(options_.kv.capacity),
                  .first_query = m - 1,
                  .aggregation = ScoreAggregation::kMean};
      scores = &observed;
    }
    const KvLayerView view = cache_->View(seq_id, layer_idx);
    const auto attention_start = std::chrono::steady_clock::now();
    AttentionAnyHeads(view, s.q.data(), m, attention_params, s.attn.data(), pool, scores);
    profile_.attention_seconds += SecondsSince(attention_start);
    profile_.attention_calls += 1;
    profile_.cache_bytes_read += static_cast<double>(DecodeBytesRead(view));
    if (observer_) observer_(layer_idx, observed_scores_, observed.stride);
    if (evictor_ != nullptr) {
      const auto eviction_start = std::chrono::steady_clock::now();
      KVS_RETURN_IF_ERROR(evictor_->EndLayerStep(seq_id, layer_idx, *cache_));
      profile_.eviction_seconds += SecondsSince(eviction_start);
    }
    ops::MatMul(w.wo, s.attn.data(), m, s.gate.data(), pool);
    for (size_t i = 0; i < static_cast<size_t>(m) * dim; ++i) s.x[i] += s.gate[i];

    // Feed-forward block: x += W_down (silu(W_gate xn) * W_up xn).
    for (int t = 0; t < m; ++t) {
      ops::RmsNorm(&s.x[t * dim], w.ffn_norm.data(), dim, hp.rms_eps, &s.xn[t * dim]);
    }
    ops::MatMul(w.w_gate, s.xn.data(), m, s.gate.data(), pool);
    ops::MatMul(w.w_up, s.xn.data(), m, s.up.data(), pool);
    for (int t = 0; t < m; ++t) {
      ops::SwiGlu(&s.gate[static_cast<size_t>(t) * hp.ffn_dim],
                  &s.up[static_cast<size_t>(t) * hp.ffn_dim], hp.ffn_dim);
    }
    ops::MatMul(w.w_down, s.gate.data(), m, s.xn.data(), pool);
    for (size_t i = 0; i < static_cast<size_t>(m) * dim; ++i) s.x[i] += s.xn[i];
  }

  if (logits == nullptr) return absl::OkStatus();
  // Only the rows whose logits are wanted go through the output head.
  const int first_row = all_logits ? 0 : m - 1;
  const int num_rows = m - first_row;
  for (int t = first_row; t < m; ++t) {
    ops::RmsNorm(&s.x[t * dim], model_.output_norm().data(), dim, hp.rms_eps,
                 &s.xn[(t - first_row) * dim]);
  }
  ops::MatMul(model_.output(), s.xn.data(), num_rows, logits, pool);
  return absl::OkStatus();
}

}  // namespace kvstack
