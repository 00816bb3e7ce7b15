// RoPE tables against Hugging Face transformers (5.24.0, the version in the repo's .venv) for
// DeepSeek-V3: default RoPE and YaRN (the V3 config: factor 40, original 4096, beta_fast 32,
// beta_slow 1, mscale = mscale_all_dim = 1; and mscale 0.707 so the cos/sin attention factor is
// not 1), dim 64, theta 10000. The values below were printed by this script, run as
//   .venv/bin/python gen_rope.py
// (HF computes inv_freq, the angles and cos/sin in f32; we compute in double, so the tolerance on
// cos/sin grows with the position: HF's f32 angle pos * inv_freq carries an error ~ pos * 6e-8.)

//   import torch
//   from transformers import DeepseekV3Config
//   from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding, yarn_apply_mscale
//   P = [0, 1, 7, 100, 1000, 4095, 70000]; I = [0, 1, 5, 10, 16, 20, 31]
//   def run(name, rp):
//       cfg = DeepseekV3Config(qk_rope_head_dim=64, max_position_embeddings=163840, rope_parameters=rp, hidden_size=64,
//           num_attention_heads=1, intermediate_size=64, moe_intermediate_size=64, num_hidden_layers=1, vocab_size=16)
//       e = DeepseekV3RotaryEmbedding(cfg); cos, sin = e(torch.zeros(1), torch.tensor([P]))
//       print(f"// {name}: attention_factor {e.attention_scaling:.17g} softmax_mscale {yarn_apply_mscale(cfg.rope_parameters, 1.0):.17g}")
//       print("  {" + ", ".join(f"{float(e.inv_freq[i]):.9g}" for i in I) + "},")
//       for a, p in enumerate(P):
//           print("  {" + ", ".join(f"{{{cos[0, a, i].item():.9g}f, {sin[0, a, i].item():.9g}f}}" for i in I) + "},")
//   run("plain", {"rope_type": "default", "rope_theta": 10000.0})
//   y = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
//   run("yarn", dict(y, mscale=1.0, mscale_all_dim=1.0))
//   run("yarn mscale 0.707", dict(y, mscale=0.707, mscale_all_dim=1.0))
#include <gtest/gtest.h>
#include <cmath>
#include <vector>
#include "kernels/rope.h"

namespace {
using trex::kern::RopeParams;

constexpr int kP = 7, kI = 7;
const int kPos[kP] = {0, 1, 7, 100, 1000, 4095, 70000};
const int kIdx[kI] = {0, 1, 5, 10, 16, 20, 31};

struct HfRef {
  double attention_factor, softmax_mscale;
  double inv_freq[kI];
  float cs[kP][kI][2];  // {cos, sin} at (kPos[p], kIdx[i])
};

// plain: attention_factor 1 softmax_mscale 1
const HfRef kPlain = {
    1, 1,
    {1, 0.749894202, 0.237137362, 0.0562341288, 0.00999999978, 0.00316227786, 0.00013335215},
    {
    {{1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 0.0f}},
    {{0.540302336f, 0.841470957f}, {0.731760979f, 0.681561351f}, {0.972014427f, 0.234921068f}, {0.998419285f, 0.0562044941f}, {0.999949992f, 0.00999983307f}, {0.999994993f, 0.00316227251f}, {1.0f, 0.00013335215f}},
    {{0.753902256f, 0.656986594f}, {0.511449277f, -0.859313488f}, {-0.0890471488f, 0.99602741f}, {0.923519492f, 0.383551538f}, {0.997551024f, 0.0699428469f}, {0.999755025f, 0.0221341364f}, {0.999999583f, 0.000933464966f}},
    {{0.862318873f, -0.506365657f}, {0.917596221f, -0.397513688f}, {0.15120846f, -0.988501906f}, {0.790131867f, -0.612936914f}, {0.540302336f, 0.841470957f}, {0.950415254f, 0.310983628f}, {0.99991107f, 0.01333482f}},
    {{0.562379062f, 0.826879561f}, {-0.584592879f, 0.811326802f}, {-0.0528610758f, -0.998601854f}, {0.950938582f, -0.309379756f}, {-0.839071512f, -0.54402113f}, {-0.999786079f, -0.0206838083f}, {0.991121769f, 0.132957265f}},
    {{-0.0659759939f, -0.997821212f}, {-0.0900463611f, -0.995937586f}, {-0.947527826f, -0.31967333f}, {-0.587768018f, -0.80902952f}, {-0.994033098f, -0.109078795f}, {0.927488983f, 0.373850524f}, {0.854568422f, 0.519338846f}},
    {{0.567353964f, -0.82347405f}, {-0.96163398f, 0.274335712f}, {0.847070634f, -0.531480312f}, {-0.99964416f, 0.0266757682f}, {-0.839104295f, 0.543970525f}, {0.122522153f, 0.992465794f}, {-0.995941281f, 0.0900050029f}},
    }};

// yarn: attention_factor 1 softmax_mscale 1.8738542070926265
const HfRef kYarn = {
    1, 1.8738542070926265,
    {1, 0.749894202, 0.237137362, 0.0562341288, 0.00550000044, 0.000790569407, 3.33380353e-06},
    {
    {{1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 0.0f}},
    {{0.540302336f, 0.841470957f}, {0.731760979f, 0.681561351f}, {0.972014427f, 0.234921068f}, {0.998419285f, 0.0562044941f}, {0.99998486f, 0.0054999725f}, {0.999999702f, 0.000790569349f}, {1.0f, 3.33380353e-06f}},
    {{0.753902256f, 0.656986594f}, {0.511449277f, -0.859313488f}, {-0.0890471488f, 0.99602741f}, {0.923519492f, 0.383551538f}, {0.999258935f, 0.0384904929f}, {0.999984682f, 0.00553395739f}, {1.0f, 2.33366245e-05f}},
    {{0.862318873f, -0.506365657f}, {0.917596221f, -0.397513688f}, {0.15120846f, -0.988501906f}, {0.790131867f, -0.612936914f}, {0.852524459f, 0.522687316f}, {0.996876597f, 0.0789746121f}, {0.99999994f, 0.000333380362f}},
    {{0.562379062f, 0.826879561f}, {-0.584592879f, 0.811326802f}, {-0.0528610758f, -0.998601854f}, {0.950938582f, -0.309379756f}, {0.70867008f, -0.705540001f}, {0.703440726f, 0.710753918f}, {0.999994457f, 0.00333379721f}},
    {{-0.0659759939f, -0.997821212f}, {-0.0900463611f, -0.995937586f}, {-0.947527826f, -0.31967333f}, {-0.587768018f, -0.80902952f}, {-0.862122595f, -0.506699741f}, {-0.995415747f, -0.0956426263f}, {0.999906838f, 0.0136515014f}},
    {{0.567353964f, -0.82347405f}, {-0.96163398f, 0.274335712f}, {0.847070634f, -0.531480312f}, {-0.99964416f, 0.0266757682f}, {-0.154311389f, 0.988022268f}, {0.354133695f, -0.93519479f}, {0.972893476f, 0.231253833f}},
    }};

// yarn mscale 0.707: attention_factor 0.92104235531633993 softmax_mscale 1.8738542070926265
const HfRef kYarnMscale = {
    0.92104235531633993, 1.8738542070926265,
    {1, 0.749894202, 0.237137362, 0.0562341288, 0.00550000044, 0.000790569407, 3.33380353e-06},
    {
    {{0.921042383f, 0.0f}, {0.921042383f, 0.0f}, {0.921042383f, 0.0f}, {0.921042383f, 0.0f}, {0.921042383f, 0.0f}, {0.921042383f, 0.0f}, {0.921042383f, 0.0f}},
    {{0.497641355f, 0.775030434f}, {0.673982859f, 0.62774688f}, {0.895266473f, 0.216372266f}, {0.91958648f, 0.0517667197f}, {0.921028435f, 0.00506570796f}, {0.921042085f, 0.000728147861f}, {0.921042383f, 3.07057439e-06f}},
    {{0.694375932f, 0.605112493f}, {0.471066475f, -0.79146415f}, {-0.0820161998f, 0.917383432f}, {0.8506006f, 0.353267223f}, {0.92035985f, 0.0354513749f}, {0.921028256f, 0.00509700924f}, {0.921042383f, 2.1494021e-05f}},
    {{0.794232249f, -0.466384232f}, {0.845144987f, -0.366126955f}, {0.139269397f, -0.910452127f}, {0.727744937f, -0.564540863f}, {0.785211146f, 0.481417179f}, {0.918165624f, 0.0727389678f}, {0.921042323f, 0.000307057431f}},
    {{0.517974973f, 0.761591136f}, {-0.538434803f, 0.747266352f}, {-0.0486872904f, -0.919754624f}, {0.875854731f, -0.284951866f}, {0.652715206f, -0.649832249f}, {0.647898734f, 0.654634476f}, {0.921037257f, 0.00307056843f}},
    {{-0.0607666858f, -0.919035614f}, {-0.0829365179f, -0.917300701f}, {-0.872713268f, -0.2944327f}, {-0.541359246f, -0.745150447f}, {-0.794051468f, -0.466691941f}, {-0.916820109f, -0.0880909115f}, {0.920956552f, 0.012573611f}},
    {{0.52255702f, -0.758454502f}, {-0.88570565f, 0.252674818f}, {0.780187964f, -0.489515901f}, {-0.920714617f, 0.0245695133f}, {-0.142127335f, 0.910010397f}, {0.326172143f, -0.861354053f}, {0.896076143f, 0.212994576f}},
    }};

RopeParams plain() { return RopeParams{64, 10000.0}; }
RopeParams yarn(double mscale) {
  RopeParams p{64, 10000.0};
  p.yarn = true;
  p.factor = 40;
  p.original_max_pos = 4096;
  p.beta_fast = 32;
  p.beta_slow = 1;
  p.mscale = mscale;
  p.mscale_all_dim = 1;
  return p;
}

void check(const RopeParams& p, const HfRef& ref) {
  EXPECT_NEAR(trex::kern::rope_attention_factor(p), ref.attention_factor, 1e-12);
  EXPECT_NEAR(trex::kern::yarn_softmax_mscale(p), ref.softmax_mscale, 1e-12);
  std::vector<double> inv(32);
  trex::kern::rope_inv_freq(p, inv.data());
  for (int i = 0; i < kI; ++i)  // HF's inv_freq is f32: within its rounding
    EXPECT_NEAR(inv[kIdx[i]], ref.inv_freq[i], 3e-7 * ref.inv_freq[i]) << "inv_freq " << kIdx[i];
  const int64_t max_pos = 70001;
  std::vector<float> cs(max_pos * 32), sn(max_pos * 32);
  trex::kern::rope_tables(p, max_pos, cs.data(), sn.data());
  for (int a = 0; a < kP; ++a)
    for (int i = 0; i < kI; ++i) {
      const int64_t at = static_cast<int64_t>(kPos[a]) * 32 + kIdx[i];
      const double tol = 2e-7 + 1.2e-7 * kPos[a];
      EXPECT_NEAR(cs[at], ref.cs[a][i][0], tol) << "cos pos " << kPos[a] << " i " << kIdx[i];
      EXPECT_NEAR(sn[at], ref.cs[a][i][1], tol) << "sin pos " << kPos[a] << " i " << kIdx[i];
    }
}

TEST(RopeYarn, PlainMatchesTransformers) { check(plain(), kPlain); }
TEST(RopeYarn, DeepSeekV3YarnMatchesTransformers) { check(yarn(1.0), kYarn); }
TEST(RopeYarn, YarnAttentionFactorMatchesTransformers) { check(yarn(0.707), kYarnMscale); }

// Closed forms: with mscale == mscale_all_dim the cos/sin factor is 1 and the softmax factor is
// (0.1 ln 40 + 1)^2; without mscale_all_dim the factor is 0.1 ln(factor) + 1 and softmax gets 1.
TEST(RopeYarn, MscaleClosedForms) {
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(trex::kern::yarn_softmax_mscale(yarn(1.0)), m * m, 1e-15);
  RopeParams p = yarn(1.0);
  p.mscale_all_dim = 0;
  EXPECT_NEAR(trex::kern::rope_attention_factor(p), m, 1e-15);
  EXPECT_EQ(trex::kern::yarn_softmax_mscale(p), 1.0);
  EXPECT_EQ(trex::kern::yarn_softmax_mscale(plain()), 1.0);
  EXPECT_EQ(trex::kern::rope_attention_factor(plain()), 1.0);
}

// truncate = false keeps the fractional correction range (a different ramp than truncate = true).
// HF values: the script above with "truncate": False added to the yarn rope_parameters, printing
// inv_freq at kIdx.
TEST(RopeYarn, NoTruncateMatchesTransformers) {
  const double hf[kI] = {1, 0.749894202, 0.237137362, 0.0562341288, 0.00552406255, 0.000722638157, 3.33380353e-06};
  RopeParams p = yarn(1.0);
  p.truncate = false;
  std::vector<double> inv(32);
  trex::kern::rope_inv_freq(p, inv.data());
  for (int i = 0; i < kI; ++i) EXPECT_NEAR(inv[kIdx[i]], hf[i], 3e-7 * hf[i]) << "inv_freq " << kIdx[i];
  EXPECT_NE(inv[16], kYarn.inv_freq[4]);
}

}  // namespace
