#!/usr/bin/env python3
"""The reference for tests/data:gpt2_tokenizer_test: GPT-2's tokenizer files and encodings, made
independently of chorus's C++ with Python's `regex` module (Debian's python3-regex), the module and
pattern GPT-2's own encoder.py uses.

    gpt2_bpe_reference.py OUT_DIR

Learns byte-level BPE merges from a small corpus (GPT-2's pre-split; the most frequent adjacent
pair each time, ties to the smaller pair), writes them as GPT-2 publishes its files
(OUT_DIR/vocab.json with ids in a shuffled order, so that an encoder that numbers tokens by merge
order fails; OUT_DIR/merges.txt with its "#version" line), and encodes the test texts with
encoder.py's algorithm into OUT_DIR/cases.json: [{"text", "pieces", "ids"}].
Exit status 3 when the regex module is missing.
"""
import json
import os
import random
import sys

try:
    import regex
except ImportError as e:
    print(f"gpt2_bpe_reference.py: {e} (install python3-regex: bash tools/setup.sh)", file=sys.stderr)
    sys.exit(3)

PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()


def symbols(piece):
    return tuple(B2U[b] for b in piece.encode("utf-8"))


def learn(corpus, n_merges):
    words = {}
    for piece in PATTERN.findall(corpus):
        w = symbols(piece)
        words[w] = words.get(w, 0) + 1
    merges = []
    for _ in range(n_merges):
        counts = {}
        for w, f in words.items():
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + f
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        merged = {}
        for w, f in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + f
        words = merged
    return merges


def bpe(piece, ranks):
    """encoder.py's Encoder.bpe: merge the lowest-ranked adjacent pair until none has a rank."""
    word = symbols(piece)
    while len(word) > 1:
        pairs = set(zip(word, word[1:]))
        bigram = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new_word, i = [], 0
        while i < len(word):
            try:
                j = word.index(first, i)
            except ValueError:
                new_word.extend(word[i:])
                break
            new_word.extend(word[i:j])
            i = j
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
    return word


TEXTS = [
    "Hello world",
    "I'm sure they'll say we've done what you'd expect; it's THEIR'S, don't you think?",
    "We'VE got 'quotes' and ''double'' and '' 's",
    "The year 1984 had 365 days; pi is 3.14159, 2nd and x2y.",
    "    leading spaces, two  between and trailing   ",
    "line one\nline two\n\n  indented\ttab\r\nwindows\n",
    "!!!???... --- ***  ,,, (parens) [brackets] {braces}",
    "café naïve façade Ærøskøbing Straße",
    "日本語のテキストと漢字。中文也可以！",
    "Привет, мир! Καλημέρα κόσμε",
    "مرحبا بالعالم and हिन्दी भाषा and ภาษาไทย",
    "emoji 👍🏽 and 🇩🇪 flags, ❤️ hearts",
    "e\u0301 combining acute, a\u0308 umlaut",
    "no\u00a0break and ideographic\u3000space, em\u2003space, line\u2028separator",
    "superscript x² and roman Ⅻ and fractions ½ ¾ and ٣ arabic digits",
    "tabs\t\tand\x0bvertical\x0cform feed\x1cfile separator",
    "<|endoftext|>The end",
    "a",
    " ",
    "",
    "   \n",
]

CORPUS = """
The quick brown fox jumps over the lazy dog. It's the fox's day; they're quick and we're not.
In 1776 and 1789 and 1865 the numbers 123 and 4567 came up again and again.
Unicode: café, naïve, 日本語, Привет мир, Καλημέρα, مرحبا, हिन्दी, 👍 👍 👍.
    Indented text with     many spaces
and new lines
and more lines.
""" * 3 + " ".join(TEXTS) * 2


def main():
    if len(sys.argv) != 2:
        print("usage: gpt2_bpe_reference.py OUT_DIR", file=sys.stderr)
        sys.exit(2)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    merges = learn(CORPUS, 400)
    ranks = {m: i for i, m in enumerate(merges)}
    tokens = [B2U[b] for b in range(256)] + [a + b for a, b in merges] + ["<|endoftext|>"]
    tokens = list(dict.fromkeys(tokens))  # a merge result can repeat a single byte's token only in theory
    ids = list(range(len(tokens)))
    random.Random(5).shuffle(ids)
    vocab = dict(zip(tokens, ids))
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    cases = []
    for text in TEXTS:
        pieces = PATTERN.findall(text)
        cases.append({"text": text, "pieces": pieces, "ids": [vocab[s] for p in pieces for s in bpe(p, ranks)]})
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"merges": len(merges), "vocab": len(vocab), "cases": cases}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
