// The latent codec: coordinates in the joint PCA basis of [k; v]. Encoding projects the whole
// vector (in double, like the low-rank codec); each role's decode basis is its half of the
// joint directions (no longer orthonormal, which decoding does not need), so decoding, the
// unit format and the kernels' fast path are the low-rank codec's (CoordinateCodec).
#include "represent/latent_codec.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kvstack/check.h"

namespace kvstack {
namespace {

constexpr std::string_view kPrefix = "latent-";

struct LatentName {
  int rank = 0;
  bool int4 = false;
};

absl::StatusOr<LatentName> ParseName(std::string_view name) {
  const auto bad = [&]() {
    return absl::InvalidArgumentError(
        absl::StrFormat("codec '%s': expected latent-r<rank>[-int4]", std::string(name)));
  };
  if (name.substr(0, kPrefix.size()) != kPrefix) return bad();
  std::string_view rest = name.substr(kPrefix.size());
  LatentName out;
  constexpr std::string_view kInt4 = "-int4";
  if (rest.size() > kInt4.size() && rest.substr(rest.size() - kInt4.size()) == kInt4) {
    out.int4 = true;
    rest.remove_suffix(kInt4.size());
  }
  if (rest.empty() || rest[0] != 'r') return bad();
  if (!absl::SimpleAtoi(std::string(rest.substr(1)), &out.rank) || out.rank < 1) return bad();
  return out;
}

}  // namespace

bool IsLatentCodecName(std::string_view name) { return name.substr(0, kPrefix.size()) == kPrefix; }

absl::Status CheckLatentCodecName(std::string_view name) { return ParseName(name).status(); }

absl::Status CheckLatentPair(std::string_view k_name, std::string_view v_name) {
  const bool k_latent = IsLatentCodecName(k_name);
  const bool v_latent = IsLatentCodecName(v_name);
  if (!k_latent && !v_latent) return absl::OkStatus();
  if (k_latent && v_latent && k_name == v_name) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "codecs k='%s' v='%s': a latent codec stores keys and values together; allowed: the same "
      "latent-r<rank>[-int4] for both",
      std::string(k_name), std::string(v_name)));
}

absl::StatusOr<std::unique_ptr<LatentCodec>> LatentCodec::Create(std::string_view name,
                                                                 const KvProfile& profile,
                                                                 int layer_idx, CodecRole role) {
  KVS_ASSIGN_OR_RETURN(const LatentName parsed, ParseName(name));
  const int head_dim = profile.head_dim();
  const int dims = 2 * head_dim;
  if (parsed.rank > dims) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "codec '%s': rank %d is above 2*head_dim %d (the joint [k; v]); allowed: 1..%d",
        std::string(name), parsed.rank, dims, dims));
  }
  const int rank = parsed.rank;
  std::unique_ptr<LatentCodec> codec(
      new LatentCodec(std::string(name), head_dim, rank, parsed.int4, profile.num_kv_heads()));
  codec->role_ = role;
  const int half = role == CodecRole::kKey ? 0 : head_dim;
  for (int h = 0; h < profile.num_kv_heads(); ++h) {
    const HeadComponents& c = profile.joint_components(layer_idx, h);
    KVS_CHECK(c.mean.size() == static_cast<size_t>(dims));
    codec->joint_means_.insert(codec->joint_means_.end(), c.mean.begin(), c.mean.end());
    codec->joint_rows_.insert(codec->joint_rows_.end(), c.basis.begin(),
                              c.basis.begin() + static_cast<size_t>(rank) * dims);
    // This role's half: x = mean + sum_j c_j e_j, read on [0, head_dim) or [head_dim, dims).
    std::vector<float> mean(head_dim), basis(static_cast<size_t>(rank) * head_dim);
    for (int i = 0; i < head_dim; ++i) mean[i] = static_cast<float>(c.mean[half + i]);
    for (int j = 0; j < rank; ++j) {
      for (int i = 0; i < head_dim; ++i) {
        basis[static_cast<size_t>(j) * head_dim + i] =
            static_cast<float>(c.basis[static_cast<size_t>(j) * dims + half + i]);
      }
    }
    codec->AddHead(mean, basis);
  }
  return codec;
}

void LatentCodec::EncodeJointHead(int kv_head, std::span<const float> k, std::span<const float> v,
                                  std::span<std::byte> dst) const {
  const int dim = head_dim();
  const int dims = 2 * dim;
  KVS_CHECK(kv_head >= 0 && kv_head < num_kv_heads());
  KVS_CHECK(k.size() == v.size() && k.size() % dim == 0);
  const size_t num_rows = k.size() / dim;
  KVS_CHECK(dst.size() == num_rows * unit_bytes());
  const size_t head = static_cast<size_t>(kv_head);
  const double* mu = joint_means_.data() + head * dims;
  const double* e = joint_rows_.data() + head * rank() * dims;
  std::vector<double> y(dims);
  std::vector<float> coords(rank());
  for (size_t r = 0; r < num_rows; ++r) {
    for (int i = 0; i < dims; ++i) {
      const float x = i < dim ? k[r * dim + i] : v[r * dim + i - dim];
      y[i] = std::isfinite(x) ? x - mu[i] : 0.0;
    }
    for (int j = 0; j < rank(); ++j) {
      double sum = 0;
      for (int i = 0; i < dims; ++i) sum += e[static_cast<size_t>(j) * dims + i] * y[i];
      coords[j] = static_cast<float>(sum);
    }
    StoreCoordinates(coords.data(), dst.data() + r * unit_bytes());
  }
}

void LatentCodec::EncodeHead(int kv_head, std::span<const float> src,
                             std::span<std::byte> dst) const {
  KVS_CHECK(false && "LatentCodec encodes keys and values together: call EncodeJointHead");
}

}  // namespace kvstack
