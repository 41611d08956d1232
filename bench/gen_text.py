#!/usr/bin/env python3
"""Generates the text benchmarks' data (bench/text.sh), deterministically, and caches it.

    python bench/gen_text.py [--out DIR] [--lines N] [--shards K] [--seed S]

writes under DIR (default $TEXT_BENCH_DATA, else ~/.cache/granary-text-bench):

    corpus/text-0000i-of-0000K.jsonl   {"id": N, "text": "..."} per line, N from 0 across shards
    wordpiece.json                     BERT WordPiece, vocab 30000, uncased (BertNormalizer with
                                       lowercase, BertPreTokenizer), "[CLS] $A [SEP]" template,
                                       [PAD] = 0
    bpe.json                           GPT-2 style byte-level BPE, vocab 32000 (ByteLevel
                                       pre-tokenizer, decoder and post-processor, no prefix space),
                                       <|endoftext|> = 0, the packing separator
    meta.json                          what was generated: parameters, sizes, the ids above

and does nothing when meta.json already records the same parameters (delete DIR to redo it).

The text is synthetic but shaped like prose for a tokenizer: words are built from syllables with
prefixes and suffixes (so that a 30k WordPiece vocabulary holds the frequent words whole and splits
the rare ones into `##` pieces), drawn from a Zipf-Mandelbrot law over ~150k word forms after a
list of English function words; numbers, commas and sentence ends are sprinkled in, and sentences
start with a capital. Each line's length in words is log-normal (median 24 words, sigma 0.8, cut
to 1..300), so lengths have a long tail and padding to the longest of a batch wastes much of it,
which bucketing recovers. Needs only the Python standard library and `tokenizers` (pinned in
bench/peers/requirements-text.txt); 250,000 lines (~50 MB) take a few seconds to write and under a
minute to train both tokenizers on 2 cores.
"""
import argparse
import itertools
import json
import math
import os
import random
import sys
import time

VERSION = 1

FUNCTION_WORDS = """the of and to a in is that for it was on with as he be by at his this from
are or an had not but were which have they one you all their has been there we her she when who
would more if will so no can out what up about into them than its only some other could time then
these two may first do any like my now over such our also new after most me made many before must
through back years where much your way well down should because each just those people how too
little state good very make world still own see men work long here get both between life being
under never day same another know while last might us great old year off come since against go
came right used take three""".split()

ONSETS = ("", "", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v",
          "w", "z", "br", "cr", "dr", "fr", "gr", "pr", "tr", "bl", "cl", "fl", "gl", "pl", "sl",
          "st", "sp", "sk", "sh", "ch", "th", "ph", "wh", "qu", "str", "sc")
NUCLEI = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ea", "ee", "oo", "ou", "ie", "y", "au")
CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "rt", "ng", "ck", "x", "ll", "th",
         "mp", "nt", "rd")
PREFIXES = ("un", "re", "pre", "dis", "over", "under", "inter", "anti", "non", "mis", "sub",
            "super", "co", "de", "trans", "micro", "multi")
SUFFIXES = ("s", "s", "s", "ed", "ed", "ing", "ing", "er", "ers", "ly", "ly", "ness", "tion",
            "tions", "ment", "ments", "able", "ful", "less", "ous", "ive", "ity", "ize", "ized",
            "ization", "al", "ist", "ism", "ic", "est")


def stem(rng):
    """One made-up stem of 1 to 3 syllables."""
    syllables = rng.choices((1, 2, 3), weights=(3, 5, 2))[0]
    return "".join(rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(CODAS) for _ in range(syllables))


def lexicon(rng, forms):
    """The word forms in rank order: the function words, then `forms` made-up words whose stems
    are themselves Zipf-distributed (a frequent stem appears in many forms, as `run`, `running`,
    `rerun`)."""
    stems, seen = [], set(FUNCTION_WORDS)
    while len(stems) < forms // 4:
        s = stem(rng)
        if len(s) >= 2 and s not in seen:
            seen.add(s)
            stems.append(s)
    stem_weights = list(itertools.accumulate(1.0 / (r + 1) ** 0.9 for r in range(len(stems))))
    words = list(FUNCTION_WORDS)
    while len(words) < len(FUNCTION_WORDS) + forms:
        s = rng.choices(stems, cum_weights=stem_weights)[0]
        if rng.random() < 0.15:
            s = rng.choice(PREFIXES) + s
        if rng.random() < 0.55:
            s += rng.choice(SUFFIXES)
        if s not in seen:
            seen.add(s)
            words.append(s)
    return words


def lines(rng, words, n, median_words, sigma, max_words):
    """`n` JSON lines: words drawn by Zipf-Mandelbrot rank, log-normal lengths."""
    cum = list(itertools.accumulate(1.0 / (r + 2.7) ** 1.07 for r in range(len(words))))
    mu = math.log(median_words)
    for i in range(n):
        k = min(max_words, max(1, round(rng.lognormvariate(mu, sigma))))
        drawn = rng.choices(words, cum_weights=cum, k=k)
        out, start = [], True
        for w in drawn:
            r = rng.random()
            if r < 0.02:
                w = str(rng.randint(0, 2030)) if r < 0.01 else f"{rng.randint(1, 999)}.{rng.randint(0, 99)}"
            elif r < 0.03:
                w = w.capitalize()  # a name
            if start:
                w = w.capitalize()
                start = False
            r = rng.random()
            if r < 0.06:
                w += ","
            elif r < 0.11:
                w += rng.choice((".", ".", ".", "?", "!", ";", ":"))
                start = w[-1] in ".?!"
            out.append(w)
        if out[-1][-1] not in ".?!":
            out[-1] = out[-1].rstrip(",;:") + "."
        yield json.dumps({"id": i, "text": " ".join(out)}, ensure_ascii=False)


def train_wordpiece(files):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=30000, special_tokens=specials, min_frequency=2)
    tok.train_from_iterator(texts(files), trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def train_bpe(files):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=32000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts(files), trainer=trainer)
    return tok


def texts(files):
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)["text"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = os.environ.get("TEXT_BENCH_DATA") or os.path.expanduser("~/.cache/granary-text-bench")
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--lines", type=int, default=250_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--seed", type=int, default=22)
    args = ap.parse_args()
    params = dict(version=VERSION, lines=args.lines, shards=args.shards, seed=args.seed, forms=150_000,
                  median_words=24, sigma=0.8, max_words=300)
    meta_path = os.path.join(args.out, "meta.json")
    try:
        with open(meta_path) as f:
            if json.load(f).get("params") == params:
                print(f"text benchmark data up to date in {args.out}", file=sys.stderr)
                return
    except (OSError, ValueError):
        pass

    t0 = time.time()
    rng = random.Random(args.seed)
    words = lexicon(rng, params["forms"])
    corpus = os.path.join(args.out, "corpus")
    os.makedirs(corpus, exist_ok=True)
    for old in os.listdir(corpus):
        os.remove(os.path.join(corpus, old))
    files = [os.path.join(corpus, f"text-{i:05d}-of-{args.shards:05d}.jsonl") for i in range(args.shards)]
    per_shard = -(-args.lines // args.shards)
    generated = lines(rng, words, args.lines, params["median_words"], params["sigma"], params["max_words"])
    for path in files:
        with open(path, "w", encoding="utf-8") as f:
            for line in itertools.islice(generated, per_shard):
                f.write(line + "\n")
    size = sum(os.path.getsize(p) for p in files)
    print(f"wrote {args.lines} lines ({size / 1e6:.1f} MB) in {time.time() - t0:.1f} s", file=sys.stderr)

    t1 = time.time()
    wordpiece = train_wordpiece(files)
    wordpiece.save(os.path.join(args.out, "wordpiece.json"))
    bpe = train_bpe(files)
    bpe.save(os.path.join(args.out, "bpe.json"))
    print(f"trained both tokenizers in {time.time() - t1:.1f} s", file=sys.stderr)

    meta = dict(
        params=params,
        files=[os.path.relpath(p, args.out) for p in files],
        bytes=size,
        wordpiece=dict(vocab=wordpiece.get_vocab_size(), pad_id=wordpiece.token_to_id("[PAD]")),
        bpe=dict(vocab=bpe.get_vocab_size(), eos_id=bpe.token_to_id("<|endoftext|>")),
    )
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
