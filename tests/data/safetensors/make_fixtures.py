#!/usr/bin/env python3
"""Regenerates the safetensors fixtures read by tests/unit/test_safetensors.cpp.

Written with the reference implementation (PyPI `safetensors`, Rust core) and, for the sharded
checkpoint, `huggingface_hub.save_torch_state_dict`, so the C++ reader is tested against files
produced by the tools people actually use, and the C++ writer is compared byte for byte.

    .venv/bin/python tests/data/safetensors/make_fixtures.py

Everything is deterministic (no RNG); total size is a few KB. If you change a value here,
change the matching expectation in the test.
"""
import os
import shutil

import numpy as np
import torch
from huggingface_hub import save_torch_state_dict
from safetensors.numpy import save_file as np_save
from safetensors.torch import save_file as pt_save

HERE = os.path.dirname(os.path.abspath(__file__))

# Order of DType in core/dtype.h; byte pattern seed = position in this list.
DTYPES = [
    ("F32", torch.float32), ("BF16", torch.bfloat16), ("F16", torch.float16),
    ("F64", torch.float64), ("I64", torch.int64), ("I32", torch.int32),
    ("I16", torch.int16), ("I8", torch.int8), ("U8", torch.uint8), ("BOOL", torch.bool),
    ("F8_E4M3", torch.float8_e4m3fn), ("F8_E5M2", torch.float8_e5m2),
]
# Odd shapes, including a scalar and an empty tensor, for the all-dtypes file.
SHAPES = [(3, 5), (7,), (2, 3, 2), (5,), (3,), (1, 4), (), (0, 3), (13,), (2, 5), (3, 1, 2, 2), (9,)]


def pattern(nbytes, seed, is_bool):
    """Byte k of tensor `seed` is (37*k + 11 + seed) mod 256 (mod 2 for BOOL)."""
    k = np.arange(nbytes, dtype=np.int64)
    b = ((37 * k + 11 + seed) % 256).astype(np.uint8)
    return b & 1 if is_bool else b


def all_dtypes():
    tensors = {}
    for seed, ((name, dt), shape) in enumerate(zip(DTYPES, SHAPES)):
        numel = int(np.prod(shape)) if shape else 1
        nbytes = numel * torch.empty(0, dtype=dt).element_size()
        raw = torch.from_numpy(pattern(nbytes, seed, dt == torch.bool).copy())
        tensors["t_" + name.lower()] = raw.view(dt).reshape(shape)
    pt_save(tensors, os.path.join(HERE, "all_dtypes.safetensors"), metadata={"format": "pt"})


def mixed():
    i15 = torch.arange(15, dtype=torch.float32)
    tensors = {
        "model.embed_tokens.weight": ((i15 - 7) * 0.25).reshape(3, 5).to(torch.bfloat16),
        "model.norm.weight": 1 + torch.arange(5, dtype=torch.float32) / 8,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "ids": torch.tensor([-1, 0, 1, 1 << 40], dtype=torch.int64),
        "f64": torch.tensor([0.1, -2.5, 1e300], dtype=torch.float64),
    }
    pt_save(tensors, os.path.join(HERE, "mixed.safetensors"), metadata={"format": "pt"})


def f16_special():
    h = np.array([0.0, -0.0, 1.0, -2.0, 65504.0, -65504.0, 6.103515625e-05, 5.960464477539063e-08,
                  6.097555160522461e-05, np.inf, -np.inf, np.nan, 0.1, 1 / 3, -1e-7, 3e-6],
                 dtype=np.float16)
    np_save({"h": h, "h_as_f32": h.astype(np.float32)}, os.path.join(HERE, "f16.safetensors"),
            metadata={"format": "np"})


def with_metadata():
    np_save({"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
            os.path.join(HERE, "metadata.safetensors"),
            metadata={"format": "pt", "source": "make_fixtures.py", "note": "h\u00e9llo \"q\"\n\t"})


SHARDED_ORDER = ["embed", "layer0.w", "layer0.b", "layer1.w", "layer1.b", "big", "head"]


def sharded():
    d = os.path.join(HERE, "sharded")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    sd = {}
    for i, name in enumerate(SHARDED_ORDER):
        n = {"big": 40, "embed": 12, "head": 6}.get(name, 6 if name.endswith(".w") else 3)
        dt = torch.bfloat16 if name.endswith(".w") else torch.float32
        sd[name] = (torch.arange(n, dtype=torch.float32) + 100 * i).to(dt)
    # 64-byte shards, huggingface_hub's greedy split: [embed(48) layer0.w(12)], then big(160) is
    # over the limit and becomes a shard of its own while the current one is still open,
    # so the last shard is [layer0.b(12) layer1.w(12) layer1.b(12) head(24)].
    save_torch_state_dict(sd, d, max_shard_size=64)


if __name__ == "__main__":
    all_dtypes()
    mixed()
    f16_special()
    with_metadata()
    sharded()
    total = 0
    for root, _, files in os.walk(HERE):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    print(f"fixtures written, {total} bytes in total")
