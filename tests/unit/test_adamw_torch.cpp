// AdamW against torch.optim.AdamW (torch 2.15.0 in the repo's .venv; foreach=False, fused=False):
// three steps on 7 parameters, with the gradients scaled by 0.3 as clip_grad_norm_ does.
// Values printed by this script (.venv/bin/python gen_adamw.py):
//   import torch
//   p0 = [0.5, -1.25, 3.0, 1e-3, -2e-4, 0.0, 7.5]
//   grads = [[0.1, -0.2, 0.3, 1e-4, -5.0, 0.0, 2.0], [0.05, 0.4, -0.3, 2e-4, -4.0, 1e-6, -2.0],
//            [-0.1, 0.1, 0.0, -1e-4, 3.0, 0.0, 1.0]]
//   p = torch.nn.Parameter(torch.tensor(p0, dtype=torch.float32))
//   opt = torch.optim.AdamW([p], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False, fused=False)
//   for g in grads:
//       p.grad = torch.tensor(g, dtype=torch.float32)
//       p.grad.mul_(torch.tensor(0.3, dtype=torch.float32))  # clip_grad_norm_'s clip_coef
//       opt.step()
//       print("{" + ", ".join(f"{x:.9g}f" for x in p.tolist()) + "},")
//   st = opt.state[p]
//   print("m {" + ", ".join(f"{x:.9g}f" for x in st["exp_avg"].tolist()) + "}")
//   print("v {" + ", ".join(f"{x:.9g}f" for x in st["exp_avg_sq"].tolist()) + "}")
#include <gtest/gtest.h>
#include "core/error.h"
#include <cmath>
#include <vector>
#include "kernels/adamw.h"
#include "kernels/ref/adamw.h"

namespace {

constexpr int kN = 7;
const float kP0[kN] = {0.5f, -1.25f, 3.0f, 1e-3f, -2e-4f, 0.0f, 7.5f};
const float kGrad[3][kN] = {{0.1f, -0.2f, 0.3f, 1e-4f, -5.0f, 0.0f, 2.0f},
                            {0.05f, 0.4f, -0.3f, 2e-4f, -4.0f, 1e-6f, -2.0f},
                            {-0.1f, 0.1f, 0.0f, -1e-4f, 3.0f, 0.0f, 1.0f}};
const float kTorchP[3][kN] = {
    {0.489500016f, -1.23874998f, 2.98699999f, -0.00899766758f, 0.00980019942f, 0.0f, 7.48250008f},
    {0.479617596f, -1.24114501f, 2.98453951f, -0.0185665246f, 0.0196990408f, -0.00702271145f, 7.47554398f},
    {0.478030324f, -1.24407661f, 2.98196697f, -0.0227487795f, 0.0239172112f, -0.0124561656f, 7.46630621f}};
const float kTorchM[kN] = {0.000780000119f, 0.00894000009f, -0.000810000231f, 4.82999985e-06f,
                           -0.139500007f,   2.70000022e-08f, 0.0246000011f};
const float kTorchV[kN] = {9.6300013e-05f, 0.000891450094f, 0.000750262581f, 2.56612509e-10f,
                           0.210431263f,   4.2750007e-15f,  0.0378450043f};

// Both the dispatched kernel and the reference, 2 ulp-ish of f32 (FMA contraction may differ).
template <class Step>
void run(Step step) {
  std::vector<float> p(kP0, kP0 + kN), m(kN, 0.f), v(kN, 0.f);
  trex::kern::AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1, 1, 0.3f};
  for (int t = 0; t < 3; ++t) {
    hp.step = t + 1;
    step(hp, p.data(), kGrad[t], m.data(), v.data());
    for (int i = 0; i < kN; ++i)
      EXPECT_NEAR(p[i], kTorchP[t][i], 3e-7 * std::abs(kTorchP[t][i]) + 1e-9) << "step " << t + 1 << " i " << i;
  }
  for (int i = 0; i < kN; ++i) {
    EXPECT_NEAR(m[i], kTorchM[i], 3e-7 * std::abs(kTorchM[i])) << "m " << i;
    EXPECT_NEAR(v[i], kTorchV[i], 3e-7 * std::abs(kTorchV[i])) << "v " << i;
  }
}

TEST(AdamWTorch, KernelMatchesTorch) {
  run([](const trex::kern::AdamWParams& hp, float* p, const float* g, float* m, float* v) {
    trex::kern::adamw_step(hp, p, g, m, v, kN);
  });
}

TEST(AdamWTorch, ReferenceMatchesTorch) {
  run([](const trex::kern::AdamWParams& hp, float* p, const float* g, float* m, float* v) {
    trex::kern::ref::adamw_step<float>(hp, p, g, m, v, kN);
  });
}

TEST(AdamWTorch, Bf16CopyAndSumSquares) {
  std::vector<float> p(kP0, kP0 + kN), m(kN, 0.f), v(kN, 0.f);
  std::vector<trex::bf16> pb(kN);
  trex::kern::AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1, 1, 0.3f};
  trex::kern::adamw_step(hp, p.data(), kGrad[0], m.data(), v.data(), kN, pb.data());
  for (int i = 0; i < kN; ++i) EXPECT_EQ(pb[i].bits, trex::f32_to_bf16(p[i]).bits);
  double s = 0;
  for (int i = 0; i < kN; ++i) s += double(kP0[i]) * double(kP0[i]);
  EXPECT_DOUBLE_EQ(trex::kern::sum_squares(kP0, kN), s);
  EXPECT_EQ(trex::kern::sum_squares(kP0, 0), 0.0);
}

TEST(AdamWTorch, RejectsBadArguments) {
  float p = 1, g = 1, m = 0, v = 0;
  trex::kern::AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1, 0};
  EXPECT_THROW(trex::kern::adamw_step(hp, &p, &g, &m, &v, 1), trex::Error);  // step is 1-based
  hp.step = 1;
  hp.beta2 = 1.0;
  EXPECT_THROW(trex::kern::adamw_step(hp, &p, &g, &m, &v, 1), trex::Error);
}

}  // namespace
