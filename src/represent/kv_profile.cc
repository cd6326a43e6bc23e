// Calibration statistics of keys and values: running moments of the concatenated [k; v] per
// (layer, kv head) — one accumulation gives the key and value covariances (its diagonal
// blocks) and the joint one the latent codecs need — turned into principal components
// (SymmetricEigen, symmetric_eigen.cc), and a versioned file keyed to the model so a profile
// can never be applied to the wrong weights.
#include "kvstack/kv_profile.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>

#include "absl/strings/str_format.h"
#include "kvstack/check.h"

namespace kvstack {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'P', 'R', 'O', 'F', '\0'};
constexpr int kMaxHeadDim = 4096;

}  // namespace

double HeadComponents::EnergyRetained(int rank) const {
  const double total = std::accumulate(eigenvalues.begin(), eigenvalues.end(), 0.0);
  if (total <= 0) return 1.0;
  rank = std::clamp(rank, 0, static_cast<int>(eigenvalues.size()));
  return std::accumulate(eigenvalues.begin(), eigenvalues.begin() + rank, 0.0) / total;
}

int HeadComponents::RankForEnergy(double fraction) const {
  const int n = static_cast<int>(eigenvalues.size());
  for (int r = 1; r <= n; ++r) {
    if (EnergyRetained(r) >= fraction - 1e-12) return r;
  }
  return n;
}

KvProfile::KvProfile(uint64_t model_hash, int num_layers, int num_kv_heads, int head_dim)
    : model_hash_(model_hash),
      num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim) {
  KVS_CHECK(num_layers > 0 && num_kv_heads > 0 && head_dim > 0 && head_dim <= kMaxHeadDim);
  const size_t num_heads = static_cast<size_t>(num_layers) * num_kv_heads;
  const size_t dims = 2 * static_cast<size_t>(head_dim);
  counts_.assign(num_heads, 0);
  sums_.assign(num_heads, std::vector<double>(dims, 0.0));
  products_.assign(num_heads, std::vector<double>(dims * dims, 0.0));
  components_.resize(num_heads * 2);
  joint_.resize(num_heads);
}

size_t KvProfile::HeadIndex(int layer_idx, int kv_head) const {
  KVS_CHECK(layer_idx >= 0 && layer_idx < num_layers_ && kv_head >= 0 && kv_head < num_kv_heads_);
  return static_cast<size_t>(layer_idx) * num_kv_heads_ + kv_head;
}

void KvProfile::Accumulate(int layer_idx, std::span<const float> keys,
                           std::span<const float> values) {
  const size_t row_width = static_cast<size_t>(num_kv_heads_) * head_dim_;
  KVS_CHECK(keys.size() == values.size() && keys.size() % row_width == 0);
  const size_t num_tokens = keys.size() / row_width;
  const int dims = 2 * head_dim_;
  std::vector<double> x(dims);
  auto finite = [](const float* p, int n) {
    return std::all_of(p, p + n, [](float f) { return std::isfinite(f); });
  };
  for (int h = 0; h < num_kv_heads_; ++h) {
    const size_t idx = HeadIndex(layer_idx, h);
    std::vector<double>& sum = sums_[idx];
    std::vector<double>& prod = products_[idx];
    for (size_t t = 0; t < num_tokens; ++t) {
      const size_t offset = t * row_width + static_cast<size_t>(h) * head_dim_;
      const float* k = keys.data() + offset;
      const float* v = values.data() + offset;
      if (!finite(k, head_dim_) || !finite(v, head_dim_)) continue;
      ++counts_[idx];
      std::copy(k, k + head_dim_, x.begin());
      std::copy(v, v + head_dim_, x.begin() + head_dim_);
      for (int i = 0; i < dims; ++i) {
        sum[i] += x[i];
        double* row = prod.data() + static_cast<size_t>(i) * dims;
        for (int j = i; j < dims; ++j) row[j] += x[i] * x[j];
      }
    }
  }
}

namespace {

// PCA of the covariance block [offset, offset + n) x [offset, offset + n) of a [dims][dims]
// covariance.
HeadComponents Components(const std::vector<double>& mean, const std::vector<double>& cov, int dims,
                          int offset, int n) {
  HeadComponents out;
  out.mean.assign(mean.begin() + offset, mean.begin() + offset + n);
  std::vector<double> block(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      block[static_cast<size_t>(i) * n + j] =
          cov[static_cast<size_t>(offset + i) * dims + offset + j];
    }
  }
  SymmetricEigen(std::move(block), n, &out.eigenvalues, &out.basis);
  // A covariance is positive semi-definite; rounding may leave tiny negative values.
  for (double& value : out.eigenvalues) value = std::max(0.0, value);
  return out;
}

}  // namespace

absl::Status KvProfile::Finalize() {
  const int n = head_dim_;
  const int dims = 2 * n;
  for (size_t idx = 0; idx < counts_.size(); ++idx) {
    if (counts_[idx] == 0) {
      return absl::FailedPreconditionError("calibrate: no key/value rows were accumulated");
    }
    const double count = static_cast<double>(counts_[idx]);
    std::vector<double> mean(dims);
    for (int i = 0; i < dims; ++i) mean[i] = sums_[idx][i] / count;
    std::vector<double> cov(static_cast<size_t>(dims) * dims);
    for (int i = 0; i < dims; ++i) {
      for (int j = i; j < dims; ++j) {
        const double c =
            products_[idx][static_cast<size_t>(i) * dims + j] / count - mean[i] * mean[j];
        cov[static_cast<size_t>(i) * dims + j] = c;
        cov[static_cast<size_t>(j) * dims + i] = c;
      }
    }
    components_[idx * 2 + static_cast<size_t>(KvKind::kKey)] = Components(mean, cov, dims, 0, n);
    components_[idx * 2 + static_cast<size_t>(KvKind::kValue)] = Components(mean, cov, dims, n, n);
    joint_[idx] = Components(mean, cov, dims, 0, dims);
  }
  return absl::OkStatus();
}

const HeadComponents& KvProfile::components(int layer_idx, int kv_head, KvKind kind) const {
  return components_[HeadIndex(layer_idx, kv_head) * 2 + static_cast<size_t>(kind)];
}

const HeadComponents& KvProfile::joint_components(int layer_idx, int kv_head) const {
  return joint_[HeadIndex(layer_idx, kv_head)];
}

absl::Status KvProfile::Save(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrFormat("cannot write '%s'", path));
  auto put = [&](const void* p, size_t n) { out.write(static_cast<const char*>(p), n); };
  auto put_components = [&](const HeadComponents& c) {
    put(c.mean.data(), c.mean.size() * 8);
    put(c.eigenvalues.data(), c.eigenvalues.size() * 8);
    put(c.basis.data(), c.basis.size() * 8);
  };
  const uint32_t shape[4] = {kVersion, static_cast<uint32_t>(num_layers_),
                             static_cast<uint32_t>(num_kv_heads_),
                             static_cast<uint32_t>(head_dim_)};
  put(kMagic, sizeof(kMagic));
  put(&shape[0], 4);
  put(&model_hash_, 8);
  put(&shape[1], 12);
  put(&tokens_seen_, 8);
  for (size_t idx = 0; idx < joint_.size(); ++idx) {
    put_components(components_[idx * 2]);
    put_components(components_[idx * 2 + 1]);
    put_components(joint_[idx]);
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrFormat("writing '%s' failed", path));
  return absl::OkStatus();
}

absl::StatusOr<KvProfile> KvProfile::Load(const std::string& path, uint64_t model_hash,
                                          int num_layers, int num_kv_heads, int head_dim) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot open profile '%s'", path));
  auto get = [&](void* p, size_t n) {
    return static_cast<bool>(in.read(static_cast<char*>(p), n));
  };
  auto get_components = [&](size_t n, HeadComponents* c) {
    c->mean.resize(n);
    c->eigenvalues.resize(n);
    c->basis.resize(n * n);
    return get(c->mean.data(), n * 8) && get(c->eigenvalues.data(), n * 8) &&
           get(c->basis.data(), n * n * 8);
  };
  char magic[8];
  uint32_t version = 0;
  uint64_t hash = 0;
  uint32_t shape[3] = {0, 0, 0};
  uint64_t tokens = 0;
  if (!get(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is not a kvstack profile (bad magic)", path));
  }
  if (!get(&version, 4) || version != kVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "profile '%s' has version %u; this kvstack reads version %u (run kvstack calibrate again)",
        path, version, kVersion));
  }
  if (!get(&hash, 8) || !get(shape, 12) || !get(&tokens, 8)) {
    return absl::InvalidArgumentError(absl::StrFormat("profile '%s' is truncated", path));
  }
  if (hash != model_hash) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "profile '%s' was calibrated on another model (content hash %016x, this model %016x)", path,
        hash, model_hash));
  }
  if (shape[0] != static_cast<uint32_t>(num_layers) ||
      shape[1] != static_cast<uint32_t>(num_kv_heads) ||
      shape[2] != static_cast<uint32_t>(head_dim)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "profile '%s' has shape %u layers x %u kv heads x %u dims; the model has %d x %d x %d",
        path, shape[0], shape[1], shape[2], num_layers, num_kv_heads, head_dim));
  }
  KvProfile profile(hash, num_layers, num_kv_heads, head_dim);
  profile.tokens_seen_ = tokens;
  const size_t n = head_dim;
  for (size_t idx = 0; idx < profile.joint_.size(); ++idx) {
    if (!get_components(n, &profile.components_[idx * 2]) ||
        !get_components(n, &profile.components_[idx * 2 + 1]) ||
        !get_components(2 * n, &profile.joint_[idx])) {
      return absl::InvalidArgumentError(absl::StrFormat("profile '%s' is truncated", path));
    }
  }
  if (in.peek() != std::char_traits<char>::eof()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("profile '%s' has trailing bytes after its components", path));
  }
  return profile;
}

}  // namespace kvstack
