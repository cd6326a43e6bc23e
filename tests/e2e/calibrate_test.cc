// `kvstack calibrate` on the real model: the profile it writes loads for stories260K, says
// that the keys, the values and their joint [k; v] are not trivially low-rank (energy below 1
// at half rank, above the share a random basis would keep), and is refused for another model.
// Then the codecs built from it in a real run: full-rank latent and low-rank caches score the
// text as the F32 cache does, and a latent key codec paired with anything else is refused.
#include <cstdlib>
#include <fstream>

#include "cli_runner.h"
#include "gtest/gtest.h"
#include "kvstack/kv_profile.h"
#include "kvstack/model.h"
#include "nlohmann/json.hpp"

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

  // A few windows of text: perplexity with full-rank codecs (the bases only rotate, so the
  // codes are the F32 values to F16 rounding) against the F32 cache.
  const std::string text = dir + "/head.txt";
  std::ofstream(text)
      << testing_cli::Slurp(kShared + "/data/tinystories_valid_head256k.txt").substr(0, 6000);
  const std::string base = "perplexity -m " + kShared + "/models/stories260K.gguf -f " + text +
                           " --ctx 256 --json --profile " + out;
  auto ppl = [&](const std::string& codecs) {
    const testing_cli::CommandResult run = testing_cli::RunCli(base + " " + codecs);
    EXPECT_EQ(run.exit_code, 0) << codecs << ": " << run.err;
    return nlohmann::json::parse(run.out.empty() ? "{}" : run.out).value("ppl", 0.0);
  };
  const double reference = ppl("--k-codec f32 --v-codec f32");
  ASSERT_GT(reference, 1.0);
  EXPECT_NEAR(ppl("--k-codec latent-r16 --v-codec latent-r16"), reference, 1e-3 * reference);
  EXPECT_NEAR(ppl("--k-codec lowrank-r8 --v-codec lowrank-r8"), reference, 1e-3 * reference);
  EXPECT_GT(ppl("--k-codec latent-r4 --v-codec latent-r4"), 1.5 * reference);

  const testing_cli::CommandResult mixed =
      testing_cli::RunCli(base + " --k-codec latent-r8 --v-codec int8");
  EXPECT_NE(mixed.exit_code, 0);
  EXPECT_EQ(testing_cli::Lines(mixed.err), 1) << mixed.err;
  EXPECT_NE(mixed.err.find("allowed: the same latent-r<rank>[-int4] for both"), std::string::npos)
      << mixed.err;
  const testing_cli::CommandResult too_big =
      testing_cli::RunCli(base + " --k-codec latent-r17 --v-codec latent-r17");
  EXPECT_NE(too_big.exit_code, 0);
  EXPECT_NE(too_big.err.find("rank 17 is above 2*head_dim 16"), std::string::npos) << too_big.err;
}

}  // namespace
}  // namespace kvstack
