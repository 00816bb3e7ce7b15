#!/usr/bin/env python3
"""Fixtures for tests/unit/test_tokenizer*.cpp: a varied corpus and PyPI `tokenizers` ids for it.

    .venv/bin/python tests/data/tokenizer/make_fixtures.py [--trex BUILD/trex] [--new-corpus]

Writes (all committed, so the C++ tests need no Python):
  corpus.bin.gz              >= 10,000 records (bytes): prose, code, CJK, other scripts, emoji, numbers,
                             whitespace runs, chat / added tokens, invalid UTF-8, random code points, long lines.
                             Regenerated only with --new-corpus (it draws code lines from this Python's stdlib).
  deepseek_v3_style.json     DeepSeek-V3's exact normalizer / pre_tokenizer / post_processor / decoder and
                             added-token layout, with a 6,000-id vocab trained here by PyPI tokenizers.
  trex_trained.json          written by `trex tokenizer train` on corpus.bin's records (only with --trex).
  gpt2_style.json            ByteLevel(use_regex, add_prefix_space), ignore_merges, RobertaProcessing, added
                             tokens with lstrip / rstrip / single_word / normalized variations.
  splits_style.json          Split behaviours (Removed, Merged*, Contiguous, invert), Digits, String patterns,
                             Oniguruma-only syntax (\\h, $ as a line anchor), Sequence post-processor.
  <name>.ids.gz              PyPI ids per record (add_special_tokens=True), for a range of records.
  <name>.decode.gz           PyPI decode of random id lists (with and without skip_special_tokens).

Invalid UTF-8: PyPI tokenizers takes str only; a str made with errors='surrogateescape' is refused
(TypeError), so the expected ids are those of bytes.decode('utf-8', 'replace'). trex gets the raw bytes and
repairs them the same way (one U+FFFD per maximal ill-formed subsequence).

Binary formats, gzip-compressed (unsigned LEB128 varints "v"):
  corpus.bin : b"TRXC" v(count) then per record v(len) bytes
  *.ids      : b"TRXI" v(first record) v(count) then per record v(n) v(id)*n
  *.decode   : b"TRXD" v(count) then per case u8(skip_special) v(n) v(id)*n v(len) utf8-bytes
"""
import argparse
import glob
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"

# deepseek-ai/DeepSeek-V3 tokenizer.json pre_tokenizer, byte for byte (literal CR / LF in the third).
DS_RE1 = "\\p{N}{1,3}"
DS_RE2 = "[一-龥぀-ゟ゠-ヿ]+"
DS_RE3 = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
          " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
DS_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": DS_RE1}, "behavior": "Isolated", "invert": False},
    {"type": "Split", "pattern": {"Regex": DS_RE2}, "behavior": "Isolated", "invert": False},
    {"type": "Split", "pattern": {"Regex": DS_RE3}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
LLAMA3_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


# ----------------------------------------------------------------------------------------------- io
def v(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_v(buf, pos):
    n = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, pos


def write_gz(path, data):
    # mtime 0 and no file name in the header: the same content always gives the same bytes.
    with open(path, "wb") as f:
        f.write(gzip.compress(bytes(data), compresslevel=9, mtime=0))


def write_corpus(path, recs):
    out = bytearray(b"TRXC" + v(len(recs)))
    for r in recs:
        out += v(len(r)) + r
    write_gz(path, out)


def read_corpus(path):
    buf = gzip.open(path, "rb").read()
    assert buf[:4] == b"TRXC"
    n, pos = read_v(buf, 4)
    recs = []
    for _ in range(n):
        ln, pos = read_v(buf, pos)
        recs.append(buf[pos:pos + ln])
        pos += ln
    return recs


def write_ids(path, first, ids_list):
    out = bytearray(b"TRXI" + v(first) + v(len(ids_list)))
    for ids in ids_list:
        out += v(len(ids)) + b"".join(v(i) for i in ids)
    write_gz(path, out)


def write_decode(path, cases):
    out = bytearray(b"TRXD" + v(len(cases)))
    for skip, ids, text in cases:
        t = text.encode("utf-8")
        out += bytes([skip]) + v(len(ids)) + b"".join(v(i) for i in ids) + v(len(t)) + t
    write_gz(path, out)


# ------------------------------------------------------------------------------------------- corpus
EN = ("the of and to in is was that for it with as his on be at by had are but from or have an they which one you "
      "were all we when your can said there use each she how their if will up other about out many then them these "
      "so some her would make like into him time has two more write go see number no way could people my than first "
      "water been call who oil its now find long down day did get come made may part over new sound take only little "
      "work know place year live me back give most very after thing our just name good sentence man think say great "
      "where help through much before line right too mean old any same tell boy follow came want show also around "
      "form three small set put end does another well large must big even such because turn here why ask went men "
      "read need land different home us move try kind hand picture again change off play spell air away animal "
      "house point page letter mother answer found study still learn should America world optimization solver "
      "constraint variable objective linear integer feasible gradient tensor expert router attention").split()
CONTRACTIONS = ["don't", "it's", "we're", "I'll", "they've", "she'd", "I'm", "can't", "won't", "isn't", "It'S",
                "WE'RE", "you'LL", "o'clock", "rock'n'roll", "'s", "'t", "' s", "l'amour"]
ZH = ["今天天气很好，我们去公园散步吧。", "机器学习是人工智能的一个分支。", "深度学习模型需要大量的数据进行训练。",
      "请把这份文件发送给我。", "这个问题的最优解是多少？", "线性规划是运筹学中的重要方法。", "我爱北京天安门。",
      "他说：“明天见！”", "《红楼梦》是中国古典小说。", "混合专家模型（MoE）可以降低计算成本。", "约束条件：x + y ≤ 10。",
      "数据并行与张量并行的区别是什么？", "第一章　总则", "价格为￥1,299元，折扣８５％。", "鬱鬱蔥蔥，龘龘，𠀀𠀁𪚥。",
      "〇一二三四五六七八九十百千万亿", "你好世界", "中文、日本語、한국어混排。"]
ZH_CHARS = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坐集编宝谈府拉黑且随格尽剑讲布杀微怕母调局根曾准团段终乐切级克精哪官示冷域"
JA = ["東京は日本の首都です。", "ありがとうございます！", "カタカナとひらがなを混ぜて書く。", "ｶﾀｶﾅ（半角）とカタカナ（全角）",
      "ラーメンを食べたい。", "最適化問題を解く", "コーヒー☕️を飲みながらプログラミング。", "令和６年１２月３１日"]
KO = ["안녕하세요, 만나서 반갑습니다.", "한국어 문장입니다.", "최적화 문제를 풀어 봅시다!", "ㄱㄴㄷ ㅏㅑㅓ 한글"]
OTHER = ["Привет, как дела? Всё хорошо!", "Καλημέρα κόσμε, ΑΒΓ αβγ.", "مرحبا بالعالم ١٢٣", "שלום עולם!",
         "नमस्ते दुनिया, यह हिंदी है।", "สวัสดีครับ ภาษาไทย", "Tiếng Việt có dấu: ắ ẳ ẵ ặ", "e\u0301te\u0301 cafe\u0301 (NFD)",
         "İstanbul ılık ĞÜŞ", "Straße Größe ÄÖÜ ß ẞ", "Ελληνικά; Ἀθῆναι", "ﬁﬂ ligatures", "Ωmega ℃ ℉ № ™ ©®",
         "ⓐⓑⓒ Ⓐ ① ② ③ ⑳ Ⅻ ⅻ ½ ¾ ⁴ ₂", "١٢٣٤ ०१२३ ๑๒๓ ߁߂", "ǅungla ǈ ǋ", "ʻokina ʼ ˈstress", "ℌ𝔢𝔩𝔩𝔬 𝐛𝐨𝐥𝐝 𝟙𝟚𝟛"]
EMOJI = ["😀", "😂", "🤖", "🚀", "❤️", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🇺🇸", "1️⃣", "#️⃣", "🏳️‍🌈", "🧑🏿‍💻", "✨", "🔥", "☕", "⚡️",
         "🫠", "🙂‍↕️", "©️", "🀄", "🎉🎉🎉", "👩‍❤️‍💋‍👨", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
SYMBOLS = list("∑∫√∞≠≤≥±×÷∂∇∈∉⊂⊃∪∩∧∨¬→←↔⇒⇔∀∃€£¥₹$¢%‰§¶†‡•…‹›«»“”‘’„‚–—―·°′″‴©®™♠♣♥♦★☆☐☑☒♪♫✓✗┌─┐│└┘├┤┬┴┼█▓▒░")
SNIPPETS = [
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size();\n}",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "def f(x):\n    return x ** 2 + 3*x - 1  # comment",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"row\"><span id='x'>Hello &amp; bye</span></div>",
    "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"a\": \"b\"}}",
    "$ git commit -m \"fix: handle edge case\" && make -j8 test",
    "\\begin{equation} \\sum_{i=1}^{n} x_i^2 \\leq \\frac{1}{2} \\end{equation}",
    "## Heading\n\n- item one\n- item **two**\n\n```python\nprint('hi')\n```",
    "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", x); Ok(()) }",
    "const f = async (a, b) => { await fetch(`${url}/api?q=${a}`); };",
    "https://example.com/path/to/page?query=1&lang=en#section-2",
    "mailto:someone@example.org, user.name+tag@sub.domain.co.uk",
    "x_{t+1} = x_t - \\eta \\nabla f(x_t)",
    "@property\ndef value(self) -> int:\n\treturn self._value",
    "#define MAX(a,b) ((a)>(b)?(a):(b))\n#pragma once",
    "if (x != nullptr && *x == '\\n') { ++lines; }",
    "max 3x + 2y\ns.t. x + y <= 4\n     x, y >= 0",
    "arr[i][j] += dp[i-1][j-1]; // O(n^2)",
    "a.b.c().d?.e ?? f || g && !h",
]
WS = [" ", "  ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c", "\x85",
      "\u2003", " \n", "\n ", " \t\n", "\u200b", "\ufeff"]
DS_ADDED = [BOS, EOS, "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜fim▁hole｜>", "<｜fim▁begin｜>",
            "<｜fim▁end｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "<｜place▁holder▁no▁1｜>",
            "<｜place▁holder▁no▁12｜>", "<｜User", "<think", "｜>", "<mask>", "[SEP]", "word", "<tool>", "<tool>!"]
BAD = [b"\x80", b"\xbf", b"\xc2", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff", b"\xfe",
       b"\xe4\xb8", b"\xf0\x9f\x98", b"\xf8\x88\x80\x80\x80", b"\xc3", b"\xe2\x82", b"\xf0\x9f"]


def stdlib_lines():
    lines = []
    for p in sorted(glob.glob("/usr/lib/python3.11/*.py"))[:80]:
        with open(p, encoding="utf-8", errors="replace") as f:
            lines.extend(l.rstrip("\n") for l in f)
    return [l for l in lines if l.strip()] or ["pass"]


def make_corpus(seed=20260):
    rng = random.Random(seed)
    code = stdlib_lines()
    ch = rng.choice

    def sentence():
        n = rng.randint(3, 18)
        ws = []
        for i in range(n):
            w = ch(EN) if rng.random() > 0.08 else ch(CONTRACTIONS)
            r = rng.random()
            if r < 0.05:
                w = w.upper()
            elif r < 0.1:
                w = w.capitalize() + ch(EN).capitalize()
            elif r < 0.13:
                w = w + "-" + ch(EN)
            elif r < 0.16:
                w = str(rng.randint(0, 10 ** rng.randint(1, 7)))
            ws.append(w)
        s = " ".join(ws)
        s = s[0].upper() + s[1:]
        if rng.random() < 0.2:
            s = f'"{s}," she said'
        if rng.random() < 0.1:
            s = f"{s} ({ch(EN)} {ch(EN)})"
        return s + ch([".", ".", ".", "!", "?", "...", ";", ":", ""])

    def zh():
        if rng.random() < 0.5:
            return ch(ZH)
        return "".join(ch(ZH_CHARS) for _ in range(rng.randint(2, 30))) + ch(["。", "，", "！", "？", "", "、"])

    def number():
        r = rng.random()
        if r < 0.2:
            return str(rng.randint(0, 10 ** rng.randint(1, 30)))
        if r < 0.35:
            return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
        if r < 0.45:
            return f"{rng.randint(1, 999)},{rng.randint(0, 999):03d},{rng.randint(0, 999):03d}.{rng.randint(0, 99):02d}"
        if r < 0.55:
            return f"{rng.random():.3e}"
        if r < 0.62:
            return hex(rng.getrandbits(rng.randint(4, 64)))
        if r < 0.7:
            return f"{rng.randint(1990, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
        if r < 0.76:
            return ".".join(str(rng.randint(0, 255)) for _ in range(4))
        if r < 0.82:
            return f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}"
        if r < 0.88:
            return ch(EN) + str(rng.randint(0, 99999)) + ch(EN)
        if r < 0.94:
            return "".join(chr(0xFF10 + int(d)) for d in str(rng.randint(0, 10 ** 6)))
        return f"{rng.randint(1, 100)}% of {rng.randint(1, 10 ** 9)} = x² + ½"

    def with_ws(parts):
        out = ""
        for p in parts:
            out += p + "".join(ch(WS) for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.3:
            out = "".join(ch(WS) for _ in range(rng.randint(1, 4))) + out
        return out

    recs = []

    def add(s):
        recs.append(s.encode("utf-8") if isinstance(s, str) else s)

    for _ in range(2500):
        add(" ".join(sentence() for _ in range(rng.randint(1, 3))))
    for _ in range(1200):
        l = ch(code)
        if rng.random() < 0.2:
            l = l.replace("    ", "\t")
        add(l)
    for _ in range(500):
        i = rng.randrange(len(code))
        add("\n".join(code[i:i + rng.randint(2, 10)]) + ("\n" if rng.random() < 0.5 else ""))
    for _ in range(500):
        add(ch(SNIPPETS) if rng.random() < 0.5 else ch(SNIPPETS) + "\n" + ch(SNIPPETS))
    for _ in range(600):
        add(zh() + (zh() if rng.random() < 0.3 else "") + (" " + sentence() if rng.random() < 0.2 else ""))
    for _ in range(350):
        add(ch(JA) + (ch(JA) if rng.random() < 0.3 else "") + (number() if rng.random() < 0.2 else ""))
    for _ in range(250):
        add(ch(KO) + " " + (ch(KO) if rng.random() < 0.5 else sentence()))
    for _ in range(700):
        parts = [ch(OTHER), ch(OTHER) if rng.random() < 0.3 else "", sentence() if rng.random() < 0.3 else "",
                 zh() if rng.random() < 0.2 else "", ch(SYMBOLS) * rng.randint(0, 3)]
        rng.shuffle(parts)
        add(" ".join(p for p in parts if p))
    for _ in range(600):
        parts = [ch(EMOJI) * rng.randint(1, 3) for _ in range(rng.randint(1, 4))] + [sentence() if rng.random() < 0.5 else zh()]
        rng.shuffle(parts)
        add(ch(["", " ", ""]).join(parts))
    for _ in range(800):
        add(" ".join(number() for _ in range(rng.randint(1, 5))) + (" " + sentence() if rng.random() < 0.3 else ""))
    for _ in range(700):
        add(with_ws([ch([sentence(), zh(), ch(SNIPPETS), number(), ch(EMOJI), ch(EN)]) for _ in range(rng.randint(1, 5))]))
    for _ in range(600):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append(ch(DS_ADDED))
            parts.append(ch([sentence(), zh(), "", " ", "\n", "\n\n", ch(EN), " " + ch(EN) + " "]))
        add("".join(parts))
    for _ in range(600):
        base = ch([sentence(), zh(), ch(SNIPPETS), ch(OTHER), number()]).encode("utf-8")
        if rng.random() < 0.15:
            add(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 40))))
            continue
        for _ in range(rng.randint(1, 4)):
            pos = rng.randint(0, len(base))
            base = base[:pos] + ch(BAD) + base[pos:]
        add(base)
    for _ in range(300):
        cps = []
        for _ in range(rng.randint(1, 20)):
            c = rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0x7FF), rng.randint(0x800, 0xFFFF),
                            rng.randint(0x10000, 0x10FFFF), rng.randint(0x1F300, 0x1FAFF), rng.randint(0x4E00, 0x9FFF)])
            if 0xD800 <= c <= 0xDFFF:
                c = 0xFFFD
            cps.append(chr(c))
        add("".join(cps))
    for _ in range(40):
        kind = rng.randint(0, 7)
        n = rng.randint(500, 4000)
        add(["a" * n, "7" * n, " " * n, "\t \n" * (n // 3), "你" * n, "!?" * (n // 2),
             " ".join(sentence() for _ in range(n // 80)), ch(EMOJI) * (n // 4)][kind])
    for s in ["", " ", "a", "\n", "'s", "'S", " 's", "'ll", "ſ", "K", "\x00", "\x00\x01\x1f", "\x7f", "...", "  a",
              "a  ", "a \n", "\r\n\r\n", "\u0301", "a\u0301", "\U0010FFFF", "\ufffe", "\uffff", "\ue000", "〇", "龦",
              "𠀀", "ｶ", "ー", "ゟ", "゠", "ヿ", "#include", ".method", "@decorator", "$var", "-x", "\\n", "__init__",
              "x.y", "3.14", "1234567", "１２３", "Ⅻ", "²³", "٣", "\u00a0\u00a0", "\u3000x", "\x85", "\u2028"]:
        add(s)
    return recs


# ---------------------------------------------------------------------------------------- tokenizers
def texts_of(recs):
    return [r.decode("utf-8", "replace") for r in recs]


def train_pypi(pre, texts, vocab_size, specials):
    j = json.loads(Tokenizer(models.BPE()).to_str())
    j["pre_tokenizer"] = pre
    tok = Tokenizer.from_str(json.dumps(j))
    tr = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, tr)
    return tok


def added(content, special, normalized, single_word=False, lstrip=False, rstrip=False):
    return AddedToken(content, single_word=single_word, lstrip=lstrip, rstrip=rstrip, normalized=normalized,
                      special=special)


def finish(tok, name, edit):
    """Serialize, apply `edit` to the JSON dict, reload with PyPI (must load) and save."""
    j = json.loads(tok.to_str())
    edit(j)
    text = json.dumps(j, ensure_ascii=False, indent=2) + "\n"
    tok2 = Tokenizer.from_str(text)
    with open(os.path.join(HERE, name + ".json"), "w", encoding="utf-8") as f:
        f.write(text)
    return tok2


def merges_as_strings(j):
    j["model"]["merges"] = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in j["model"]["merges"]]


def deepseek_style(texts):
    tok = train_pypi(DS_PRE, texts, 6000, [BOS, EOS, PAD])
    tok.add_special_tokens([added(t, True, False) for t in ["<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>"]])
    tok.add_special_tokens([added(t, True, True) for t in ["<｜User｜>", "<｜Assistant｜>"]])
    tok.add_tokens([added(t, False, True) for t in ["<think>", "</think>"]])
    tok.add_special_tokens([added(t, True, True) for t in
                            ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                             "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁sep｜>"]])
    tok.add_special_tokens([added(f"<｜place▁holder▁no▁{k}｜>", True, True) for k in range(40)])

    def edit(j):
        # DeepSeek-V3's settings: empty normalizer Sequence, BOS template, ByteLevel decoder, "a b" merges.
        j["normalizer"] = {"type": "Sequence", "normalizers": []}
        j["pre_tokenizer"] = DS_PRE
        j["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [0], "tokens": [BOS]}}}
        j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        for a in j["added_tokens"][:3]:
            a["normalized"] = True
        merges_as_strings(j)
        j["model"].pop("ignore_merges", None)
    return finish(tok, "deepseek_v3_style", edit)


def gpt2_style(texts):
    pre = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    tok = train_pypi(pre, texts, 1200, ["<s>", "<pad>", "</s>"])
    tok.add_special_tokens([added("<mask>", True, False, lstrip=True), added("[SEP]", True, False, rstrip=True)])
    tok.add_tokens([added("word", False, False, single_word=True), added("<think>", False, True),
                    added("think>", False, False), added("<tool>", False, False), added("<tool>!", False, False),
                    added("  ", False, False), added("ab", False, True, single_word=True, lstrip=True, rstrip=True),
                    added("｜>", False, True, rstrip=True)])

    def edit(j):
        j["post_processor"] = {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                               "trim_offsets": True, "add_prefix_space": True}
        j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        j["model"]["ignore_merges"] = True
    return finish(tok, "gpt2_style", edit)


def splits_style(texts):
    def split(pat, beh, invert=False, literal=False):
        return {"type": "Split", "pattern": {"String" if literal else "Regex": pat}, "behavior": beh, "invert": invert}
    pre = {"type": "Sequence", "pretokenizers": [
        split("--", "Removed", literal=True),
        split("^\\s+|\\s+$", "Isolated"),
        split("\\d+", "MergedWithNext"),
        split("[,;]", "MergedWithPrevious"),
        split("[xq]+", "MergedWithPrevious", invert=True),
        split("\\h{2,}", "Isolated"),
        split("\\d", "Contiguous"),
        split("\\w+\\.", "MergedWithNext"),
        {"type": "Digits", "individual_digits": True},
        split(LLAMA3_RE, "Isolated"),
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    tok = train_pypi(pre, texts, 900, ["<s>", "</s>"])

    def edit(j):
        j["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                        {"SpecialToken": {"id": "</s>", "type_id": 0}}],
             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                                "</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}}]}
        j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        merges_as_strings(j)
    return finish(tok, "splits_style", edit)


def expect(tok, name, recs, first, count, decode_cases=0, seed=7):
    texts = texts_of(recs[first:first + count])
    ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]
    write_ids(os.path.join(HERE, name + ".ids.gz"), first, ids)
    if decode_cases:
        rng = random.Random(seed)
        n = tok.get_vocab_size(with_added_tokens=True)
        cases = []
        for k in range(decode_cases):
            if k % 3 == 0:  # a real encoding, cut anywhere (partial UTF-8 at the ends)
                src = ids[rng.randrange(len(ids))]
                a = rng.randrange(len(src) + 1)
                lst = src[a:a + rng.randint(0, 40)]
            else:
                lst = [rng.randrange(n + 3) for _ in range(rng.randint(0, 30))]
            skip = rng.random() < 0.5
            cases.append((int(skip), lst, tok.decode(lst, skip_special_tokens=skip)))
        write_decode(os.path.join(HERE, name + ".decode.gz"), cases)
    print(f"{name}: {count} records, {sum(map(len, ids))} ids" + (f", {decode_cases} decode cases" if decode_cases else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trex", help="trex binary: (re)train trex_trained.json with `trex tokenizer train`")
    ap.add_argument("--new-corpus", action="store_true", help="regenerate corpus.bin")
    a = ap.parse_args()
    cpath = os.path.join(HERE, "corpus.bin.gz")
    if a.new_corpus or not os.path.exists(cpath):
        write_corpus(cpath, make_corpus())
    recs = read_corpus(cpath)
    texts = texts_of(recs)
    print(f"corpus: {len(recs)} records, {sum(map(len, recs))} bytes")

    ds = deepseek_style(texts)
    expect(ds, "deepseek_v3_style", recs, 0, len(recs), decode_cases=1000)
    expect(gpt2_style(texts[:3000]), "gpt2_style", recs, 0, 3000)
    expect(splits_style(texts[3000:6000]), "splits_style", recs, 3000, 3000)

    trained = os.path.join(HERE, "trex_trained.json")
    if a.trex:
        # The C++ test rebuilds this training file from corpus.bin the same way and checks that
        # training reproduces trex_trained.json byte for byte.
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "train.txt"), "wb") as f:
                f.write(b"\n".join(recs) + b"\n")
            subprocess.run([a.trex, "tokenizer", "train", "--files", os.path.join(d, "train.txt"), "--vocab-size", "3000",
                            "--special-tokens", BOS, EOS, "--bos", BOS, "--out", d, "--threads", "2"], check=True)
            os.replace(os.path.join(d, "tokenizer.json"), trained)
    if os.path.exists(trained):
        expect(Tokenizer.from_file(trained), "trex_trained", recs, 0, len(recs), decode_cases=500, seed=8)
    else:
        print("trex_trained.json missing: run with --trex BUILD/trex", file=sys.stderr)


if __name__ == "__main__":
    main()
