// `kvstack calibrate` on the real model: the profile it writes loads for stories260K, says
// that the keys, the values and their joint [k; v] are not trivially low-rank (energy below 1
// at half rank, above the share a random basis would keep), and is refused for another model.
#include <cstdlib>
#include <fstream>

#include "cli_runner.h"
#include "gtest/gtest.h"
#include "kvstack/kv_profile.h"
#include "kvstack/model.h"

namespace kvstack {
namespace {

const std::string kShared = KVS_SHARED_DIR;

TEST(Calibrate, WritesAProfileKeyedToTheModel) {
  const std::string dir = testing_cli::ScratchDir();
  const std::string out = dir + "/s260.kvsprof";
  const std::string cmd = std::string(KVS_CLI_PATH) + " calibrate -m " + kShared +
                          "/models/stories260K.gguf -f " + kShared +
                          "/data/tinystories_valid_head256k.txt --ctx 256 --max-windows 4 -o " +
                          out + " >" + dir + "/calibrate.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  auto model = LlamaModel::Load(kShared + "/models/stories260K.gguf");
  ASSERT_TRUE(model.ok());
  const LlamaHparams& hp = (*model)->hparams();
  auto profile = KvProfile::Load(out, (*model)->gguf().ContentHash(), hp.num_layers,
                                 hp.num_kv_heads, hp.head_dim);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->tokens_seen(), 4u * 256u);
  for (int l = 0; l < hp.num_layers; ++l) {
    for (int h = 0; h < hp.num_kv_heads; ++h) {
      for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
        const double energy = profile->components(l, h, kind).EnergyRetained(hp.head_dim / 2);
        EXPECT_GT(energy, 0.5);  // PCA keeps at least what any half of the axes would on average
        EXPECT_LE(energy, 1.0 + 1e-12);
      }
      // The joint [k; v] of the latent codecs: 2 * head_dim dims.
      const HeadComponents& joint = profile->joint_components(l, h);
      EXPECT_EQ(joint.eigenvalues.size(), 2u * hp.head_dim);
      const double energy = joint.EnergyRetained(hp.head_dim);
      EXPECT_GT(energy, 0.5);
      EXPECT_LE(energy, 1.0 + 1e-12);
    }
  }
  // Another model (same shape is impossible to fake by hash): refused with a clear error.
  auto foreign = KvProfile::Load(out, (*model)->gguf().ContentHash() ^ 1, hp.num_layers,
                                 hp.num_kv_heads, hp.head_dim);
  EXPECT_FALSE(foreign.ok());
}

}  // namespace
}  // namespace kvstack
