#!/usr/bin/env python3
"""Regenerates the FP8 / FP4 dequantization fixtures read by tests/unit/test_quant.cpp.

    .venv/bin/python tests/data/quant/make_fixtures.py

Quantization follows the reference code paths (ported here to numpy float32 arithmetic, which is
IEEE-exact; see docs/QUANT.md for the sources):
  * DeepSeek-V3 inference/kernel.py weight_quant: 128x128 blocks, s = amax / 448 (F32),
    q = e4m3(x / s); an all-zero block gets s = 1 (transformers' Fp8Quantize convention).
  * DeepSeek-V4 inference/kernel.py act_quant with scale_fmt set (round_scale), per 128x128
    block: amax = max(amax, 1e-4), s = 2^ceil(log2(amax * f32(1/448))) via the bit trick,
    q = e4m3(clamp(x / s, -448, 448)); scale stored as ue8m0 (log2(s) + 127).
  * DeepSeek-V4 fp4_quant: per 32 consecutive elements of a row, amax = max(amax, 6 * 2^-126),
    s = 2^ceil(log2(amax * f32(1/6))), q = e2m1(clamp(x / s, -6, 6)) with ties to the even code;
    two codes per byte, element 2k in the low nibble (as DeepSeek-V4 convert.py and transformers
    unpack it); weights stored as I8, the V4 release's container dtype.
The e4m3 cast itself is torch's (`.to(torch.float8_e4m3fn)`), and every expected dequantized
tensor is torch's own `w.float() * scale.float()` on the same bytes. Shapes are deliberately not
multiples of 128 / 32 so the edge blocks are partial. Deterministic (fixed seed); ~0.6 MB.
"""
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = np.float32
FP8 = torch.float8_e4m3fn

# e2m1 codes 0..15; code 8 is -0.0 (IEEE sign-magnitude, as transformers' LUT).
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def e2m1_formula(c):
    """OCP MX e2m1: sign s, exponent e (bias 1), mantissa m."""
    s, e, m = c >> 3, (c >> 1) & 3, c & 1
    v = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
    return -v if s else v


def cdiv(a, b):
    return (a + b - 1) // b


def pow2_ceil_exp(t):
    """DeepSeek-V4 kernel.py fast_log2_ceil on float32 bits."""
    u = np.asarray(t, dtype=F32).view(np.uint32).astype(np.int64)
    return ((u >> 23) & 0xFF) - 127 + ((u & 0x7FFFFF) != 0)


def to_e4m3(q):
    return torch.from_numpy(np.ascontiguousarray(q, dtype=F32)).to(FP8)


def e2m1_codes(q):
    """Round to the e2m1 grid, ties to the even code, sign bit kept."""
    a = np.abs(q)
    c = np.select([a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5.0],
                  [0, 1, 2, 3, 4, 5, 6], 7).astype(np.uint8)
    # Cross-check with a bucketize formulation (midpoints, odd code on a tie moves up).
    mid = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F32)
    lo = np.searchsorted(mid, a, side="left")
    hi = np.searchsorted(mid, a, side="right")
    alt = lo + ((hi != lo) & (lo % 2 == 1))
    assert np.array_equal(c, alt)
    return c | (np.signbit(q).astype(np.uint8) << 3)


def quant_v3(x, b=128):
    """x: [..., R, C] f32 -> (e4m3 tensor, F32 scale_inv [..., cdiv(R,b), cdiv(C,b)])."""
    *lead, R, C = x.shape
    xs = x.reshape(-1, R, C)
    q = np.empty_like(xs)
    s = np.empty((xs.shape[0], cdiv(R, b), cdiv(C, b)), dtype=F32)
    for e in range(xs.shape[0]):
        for i in range(cdiv(R, b)):
            for j in range(cdiv(C, b)):
                blk = xs[e, i * b:(i + 1) * b, j * b:(j + 1) * b]
                amax = np.abs(blk).max()
                si = F32(1.0) if amax == 0 else F32(amax / F32(448.0))
                q[e, i * b:(i + 1) * b, j * b:(j + 1) * b] = blk / si
                s[e, i, j] = si
    return to_e4m3(q.reshape(x.shape)), torch.from_numpy(s.reshape(*lead, *s.shape[1:]))


def quant_v4_fp8(x, b=128):
    """x: [..., R, C] f32 -> (e4m3 tensor, ue8m0 bytes [..., cdiv(R,b), cdiv(C,b)] as uint8)."""
    *lead, R, C = x.shape
    xs = x.reshape(-1, R, C)
    q = np.empty_like(xs)
    e8 = np.empty((xs.shape[0], cdiv(R, b), cdiv(C, b)), dtype=np.uint8)
    inv = F32(1.0 / 448.0)
    for e in range(xs.shape[0]):
        for i in range(cdiv(R, b)):
            for j in range(cdiv(C, b)):
                blk = xs[e, i * b:(i + 1) * b, j * b:(j + 1) * b]
                amax = max(np.abs(blk).max(), F32(1e-4))
                k = int(pow2_ceil_exp(F32(amax * inv)))
                s = F32(2.0 ** k)
                q[e, i * b:(i + 1) * b, j * b:(j + 1) * b] = np.clip(blk / s, F32(-448), F32(448))
                e8[e, i, j] = k + 127
    return to_e4m3(q.reshape(x.shape)), torch.from_numpy(e8.reshape(*lead, *e8.shape[1:]))


def quant_v4_fp4(x, block=32):
    """x: [R, C] f32 (C even) -> (packed int8 [R, C/2], ue8m0 uint8 [R, cdiv(C, block)])."""
    R, C = x.shape
    codes = np.empty((R, C), dtype=np.uint8)
    e8 = np.empty((R, cdiv(C, block)), dtype=np.uint8)
    inv, floor = F32(1.0 / 6.0), F32(6.0 * 2.0 ** -126)
    for r in range(R):
        for jb in range(cdiv(C, block)):
            seg = x[r, jb * block:(jb + 1) * block]
            amax = max(np.abs(seg).max(), floor)
            k = int(pow2_ceil_exp(F32(amax * inv)))
            s = F32(2.0 ** k)
            codes[r, jb * block:(jb + 1) * block] = e2m1_codes(np.clip(seg / s, F32(-6), F32(6)))
            e8[r, jb] = k + 127
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return torch.from_numpy(packed.astype(np.uint8)).view(torch.int8), torch.from_numpy(e8)


# ---- torch's dequantization of the stored bytes ----
def expand(s, shape, br, bc):
    return s.repeat_interleave(br, -2)[..., :shape[-2], :].repeat_interleave(bc, -1)[..., :shape[-1]]


def deq_fp8(w, s_f32, b=128):
    return w.float() * expand(s_f32, w.shape, b, b)


def e8m0_f32(e8):
    return e8.view(torch.float8_e8m0fnu).float()


def unpack_fp4(packed):
    lut = torch.tensor(E2M1, dtype=torch.float32)
    u = packed.contiguous().view(torch.uint8)
    return torch.stack([lut[(u & 0xF).long()], lut[(u >> 4).long()]], dim=-1).flatten(-2)


def deq_fp4(packed, e8, block=32):
    v = unpack_fp4(packed)
    return v * e8m0_f32(e8).repeat_interleave(block, -1)[..., :v.shape[-1]]


def make_inputs(g):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).float().numpy()
    a = rnd(150, 140, scale=0.02)
    a[:40] *= 30.0               # rows with a different range
    a[128:, 128:] = 0.0          # an all-zero (partial) block
    a[3, 5], a[130, 7] = 3.5, -1e-3
    b = rnd(37, 129, scale=1.5)
    b[:, 128] = 1e-6             # a 1-wide partial column block of tiny values
    c = rnd(2, 130, 40, scale=0.1)
    d = rnd(70, 96, scale=0.05)
    d[5, :32] = 0.0              # an all-zero FP4 block
    d[6, 32:64] *= 1e-30         # a tiny block (scale near the bottom of the range)
    d[7, 64:96] *= 1e6
    e = rnd(33, 80, scale=2.0)   # 80 = 2.5 blocks of 32
    return {"fp8_a": a, "fp8_b": b, "fp8_c": c, "fp4_a": d, "fp4_b": e}


def codec_vectors(g):
    out = {}
    codes = torch.arange(256, dtype=torch.uint8)
    out["e4m3_decode"] = codes.view(FP8).float()
    out["e8m0_decode"] = codes.view(torch.float8_e8m0fnu).float()
    t = torch.tensor(E2M1, dtype=torch.float32)
    assert all(e2m1_formula(c) == E2M1[c] and np.signbit(e2m1_formula(c)) == np.signbit(E2M1[c])
               for c in range(16))
    # DeepSeek-V4 convert.py's FP4_TABLE gives +0.0 for code 8; equal as numbers.
    assert torch.equal(t, torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                        0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]))
    out["e2m1_decode"] = t
    # e4m3 encode vectors: every finite value, the midpoints between neighbours (ties), one f32
    # ulp either side, the saturation region, and random values over the whole range.
    fin = np.sort(np.unique(np.abs(out["e4m3_decode"].numpy()[np.isfinite(out["e4m3_decode"].numpy())])))
    mids = ((fin[:-1].astype(np.float64) + fin[1:]) / 2).astype(F32)
    near = np.concatenate([np.nextafter(mids, F32(0)), np.nextafter(mids, F32(1e9))])
    sat = np.array([448, 449, 463.99, 464, 464.01, 479, 480, 481, 500, 1e6, 3e38, np.inf], dtype=F32)
    rng = torch.randn(600, generator=g, dtype=torch.float64).numpy()
    rand = np.concatenate([rng[:200] * 100, rng[200:400] * 0.01, rng[400:] * 2e-3]).astype(F32)
    tiny = np.array([0.0, 2.0 ** -10, 2.0 ** -10 * 1.0001, 3 * 2.0 ** -11, 1e-30, 1e-45], dtype=F32)
    x = np.concatenate([fin, mids, near, sat, rand, tiny]).astype(F32)
    x = np.concatenate([x, -x])
    out["e4m3_encode_in"] = torch.from_numpy(x)
    out["e4m3_encode_out"] = torch.from_numpy(x).to(FP8).view(torch.uint8)
    y = np.concatenate([np.arange(0, 6.5, 0.125), [0.2499, 0.2501, 0.7499, 0.7501, 1e-30, 7.0, 100.0],
                        rng[:100] * 3]).astype(F32)
    y = np.concatenate([y, -y])
    out["e2m1_encode_in"] = torch.from_numpy(y)
    out["e2m1_encode_out"] = torch.from_numpy(e2m1_codes(y))
    return out


def special_vectors():
    """All 256 e4m3 codes and all 256 fp4 bytes under extreme scales (NaN codes, subnormal
    products, overflow to inf), dequantized by torch. Blocks are small (4x8 for fp8, 32 for fp4)."""
    out = {}
    w = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    s = torch.tensor([[1.0, 0.5], [1e-38, 3e36], [-2.0, 0.0], [1e-3, 7.25]], dtype=torch.float32)
    out["special_fp8_w"] = w
    out["special_fp8_s"] = s
    out["special_fp8_out"] = w.view(FP8).float() * expand(s, w.shape, 4, 8)
    e8 = torch.tensor([[127, 0], [1, 254], [255, 100], [130, 126]], dtype=torch.uint8)
    out["special_fp8_e8"] = e8
    out["special_fp8_e8_out"] = w.view(FP8).float() * expand(e8m0_f32(e8), w.shape, 4, 8)
    p = torch.arange(256, dtype=torch.uint8).reshape(4, 64)
    e4 = torch.tensor([[127, 0, 1, 2], [254, 253, 255, 128], [120, 131, 64, 190], [127, 127, 126, 3]],
                      dtype=torch.uint8)
    out["special_fp4_w"] = p
    out["special_fp4_e8"] = e4
    out["special_fp4_out"] = deq_fp4(p.view(torch.int8), e4, 32)
    return out


def main():
    g = torch.Generator().manual_seed(20240531)
    if os.path.isdir(HERE):
        for name in os.listdir(HERE):
            p = os.path.join(HERE, name)
            if os.path.isdir(p):
                shutil.rmtree(p)
    inputs = make_inputs(g)
    save_file({k: torch.from_numpy(v) for k, v in inputs.items()}, os.path.join(HERE, "inputs.safetensors"))
    codes = codec_vectors(g)
    codes.update(special_vectors())
    save_file(codes, os.path.join(HERE, "codes.safetensors"))

    expected = {}
    norm = torch.linspace(0.5, 1.5, 140).bfloat16()

    # V3 / R1 (HF names, "<weight>_scale_inv" F32).
    v3 = {"model.norm.weight": norm}
    for key, name in [("fp8_a", "model.layers.0.mlp.down_proj.weight"),
                      ("fp8_b", "model.layers.0.self_attn.kv_b_proj.weight"),
                      ("fp8_c", "model.layers.1.mlp.experts.down_proj.weight")]:
        w, s = quant_v3(inputs[key])
        v3[name], v3[name + "_scale_inv"] = w, s
        expected["v3/" + name] = deq_fp8(w, s)
    # V4 original layout ("<prefix>.scale"): FP8 with ue8m0 scales, FP4 experts as I8.
    v4 = {"layers.0.attn_norm.weight": norm,
          "layers.0.ffn.gate.tid2eid": torch.arange(10, dtype=torch.int64).reshape(5, 2)}
    for key, prefix in [("fp8_a", "layers.0.attn.wq_a"), ("fp8_b", "layers.0.attn.wkv")]:
        w, e8 = quant_v4_fp8(inputs[key])
        v4[prefix + ".weight"], v4[prefix + ".scale"] = w, e8
        expected["v4/" + prefix + ".weight"] = deq_fp8(w, e8m0_f32(e8))
    for key, prefix in [("fp4_a", "layers.0.ffn.experts.0.w1"), ("fp4_b", "layers.0.ffn.experts.0.w2")]:
        w, e8 = quant_v4_fp4(inputs[key])
        v4[prefix + ".weight"], v4[prefix + ".scale"] = w, e8
        expected["v4/" + prefix + ".weight"] = deq_fp4(w, e8)

    def write(dirname, tensors, config):
        d = os.path.join(HERE, dirname)
        os.makedirs(d)
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=2)

    v3_cfg = {"model_type": "deepseek_v3", "quantization_config": {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}}
    v4_cfg = {"model_type": "deepseek_v4", "expert_dtype": "fp4", "quantization_config": {
        "quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}}
    write("v3", v3, v3_cfg)
    # The V4 release stores scales as F8_E8M0; "v4" keeps the same bytes as U8 (readable before
    # core/dtype.h knows F8_E8M0), "v4_e8m0" uses the release dtypes, with one expert as F4.
    write("v4", v4, v4_cfg)
    v4r = {k: (v.view(torch.float8_e8m0fnu) if k.endswith(".scale") else v) for k, v in v4.items()}
    v4r["layers.0.ffn.experts.0.w2.weight"] = v4["layers.0.ffn.experts.0.w2.weight"].view(torch.float4_e2m1fn_x2)
    write("v4_e8m0", v4r, v4_cfg)
    save_file(expected, os.path.join(HERE, "expected.safetensors"))
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(HERE) for f in fs)
    print(f"wrote fixtures to {HERE} ({total} bytes)")


if __name__ == "__main__":
    main()
