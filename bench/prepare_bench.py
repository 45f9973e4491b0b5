#!/usr/bin/env python3
"""`trainer prepare` against the same SentencePiece model in its own Python library, on the same text.

    python bench/prepare_bench.py --trainer build/trainer [--megabytes 40] [--repeats 3] [--threads N]

The input: English-like text (a Zipf draw over a fixed vocabulary of made-up words, a document a line,
from a fixed seed), written once. A BPE model of 8,000 pieces is trained on its first 2 MB with
`trainer prepare --vocab_size` (both sides then encode with that one model). Each repeat times, wall
clock, the whole job on each side, alternating which goes first:

- ours: `trainer prepare --tokenizer MODEL --input corpus.txt --output ours.tok` (its own reading,
  OpenMP-parallel encoding across OMP_NUM_THREADS = --threads, and writing);
- python: the `sentencepiece` package's batched encoder, `SentencePieceProcessor.encode(lines,
  num_threads=--threads)` over batches of 20,000 lines read from the file, an EOS after each
  document, the ids written as uint16 with numpy: what a user's Python preprocessing script does.

Both must produce the same ids (checked on every run: the run fails otherwise). Printed: MB/s and
tokens/s per side per run, and ours / python per run with the median and spread.

With --hf, the same for a Hugging Face tokenizer.json (a byte-level BPE of 8,000 pieces trained on the
same 2 MB with the `tokenizers` library): ours is `trainer prepare --tokenizer tokenizer.json` (its
helper encodes batches over a pipe), python is the library's `encode_batch` over batches of 20,000
lines (parallel in the library's Rust threads, RAYON_NUM_THREADS = --threads on both sides), and
python_fast its `encode_batch_fast` (0.21 on: the same ids without character offsets; what our
helper calls where the library has it). Ratios are printed against each Python side.
"""
import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HEADER_BYTES = 64  # our token file's header (data/token_file.h)


def write_corpus(path, megabytes, seed=0):
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ren", "to", "sa", "vel", "un", "der", "an", "is", "or", "ta", "ne", "pri", "gh"]
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(30000)})
    weights = [1.0 / (rank + 1) for rank in range(len(words))]  # Zipf's law
    target = megabytes * 1_000_000
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            sentences = []
            for _ in range(rng.randint(1, 6)):
                sentence = " ".join(rng.choices(words, weights, k=rng.randint(5, 25)))
                sentences.append(sentence[0].upper() + sentence[1:] + ".")
            line = " ".join(sentences) + "\n"
            out.write(line)
            written += len(line.encode("utf-8"))
    return written


def read_ours(path):
    data = np.fromfile(path, dtype=np.uint8)
    width = int.from_bytes(data[12:16].tobytes(), "little")
    return np.frombuffer(data[HEADER_BYTES:].tobytes(), dtype=np.uint16 if width == 2 else np.uint32)


def run_ours(trainer, model, corpus, out, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    started = time.perf_counter()
    subprocess.run([trainer, "prepare", "--tokenizer", model, "--input", corpus, "--output", out, "--overwrite"],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def run_python(model, corpus, out, threads):
    import sentencepiece as spm

    started = time.perf_counter()
    processor = spm.SentencePieceProcessor(model_file=model)
    eos = processor.eos_id()
    pieces = []
    for batch in line_batches(corpus):
        pieces.extend(encode_batch(processor, batch, eos, threads))
    ids = np.concatenate(pieces).astype(np.uint16)
    ids.tofile(out)
    return time.perf_counter() - started


def train_hf(sample, path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train([str(sample)], trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(path))


def run_python_hf(model, corpus, out, threads, fast=False):
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    from tokenizers import Tokenizer

    started = time.perf_counter()
    tokenizer = Tokenizer.from_file(model)
    encode = tokenizer.encode_batch_fast if fast else tokenizer.encode_batch
    eos = tokenizer.token_to_id("</s>")
    pieces = []
    for batch in line_batches(corpus):
        for encoding in encode(batch, add_special_tokens=False):
            pieces.append(np.asarray(encoding.ids + [eos], dtype=np.int64))
    np.concatenate(pieces).astype(np.uint16).tofile(out)
    return time.perf_counter() - started


def line_batches(corpus, size=20000):
    """The corpus's non-blank lines (documents), newline dropped, in lists of `size`."""
    with open(corpus, encoding="utf-8") as f:
        batch = []
        for line in f:
            line = line.rstrip("\n")
            if line.strip():
                batch.append(line)
            if len(batch) == size:
                yield batch
                batch = []
        if batch:
            yield batch


def encode_batch(processor, lines, eos, threads):
    encoded = processor.encode(lines, num_threads=threads)
    return [np.asarray(ids + [eos], dtype=np.int64) for ids in encoded]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainer", required=True)
    parser.add_argument("--megabytes", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "prepare_bench"))
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--hf", action="store_true", help="a tokenizer.json through the tokenizers library")
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    corpus, sample = work / "corpus.txt", work / "sample.txt"
    if not corpus.exists() or corpus.stat().st_size < args.megabytes * 1_000_000:
        write_corpus(corpus, args.megabytes)
    with open(corpus, encoding="utf-8") as f, open(sample, "w", encoding="utf-8") as out:
        size = 0
        for line in f:
            out.write(line)
            size += len(line)
            if size > 2_000_000:
                break
    model = str(work / ("tokenizer.json" if args.hf else "tokenizer.tok.model"))
    if args.hf and not os.path.exists(model):
        train_hf(sample, model)
    if not os.path.exists(model):
        subprocess.run([args.trainer, "prepare", "--input", str(sample), "--vocab_size", "8000",
                        "--output", str(work / "tokenizer.tok"), "--overwrite"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    megabytes = corpus.stat().st_size / 1e6
    rows = []
    sides = ["ours", "python"] + (["python_fast"] if args.hf else [])
    for repeat in range(args.repeats):
        order = sides if repeat % 2 == 0 else sides[::-1]
        seconds = {}
        for side in order:
            out = str(work / f"{side}.u16")
            if side == "ours":
                seconds[side] = run_ours(args.trainer, model, str(corpus), str(work / "ours.tok"), args.threads)
            elif args.hf:
                seconds[side] = run_python_hf(model, str(corpus), out, args.threads, fast=side == "python_fast")
            else:
                seconds[side] = run_python(model, str(corpus), out, args.threads)
        ours = read_ours(work / "ours.tok")
        for side in sides[1:]:
            theirs = np.fromfile(work / f"{side}.u16", dtype=np.uint16)
            if not np.array_equal(ours, theirs):
                sys.exit(f"prepare_bench: ours and {side} differ ({len(ours)} against {len(theirs)} tokens)")
        tokens = len(ours)
        row = {"repeat": repeat + 1, "tokens": tokens, "megabytes": megabytes}
        for side in sides:
            row[f"{side}_s"] = seconds[side]
        for side in sides[1:]:
            row[f"ours_over_{side}"] = seconds[side] / seconds["ours"]
        rows.append(row)
        print(f"run {repeat + 1}: " + ", ".join(
            f"{side} {seconds[side]:.2f} s ({megabytes / seconds[side]:.1f} MB/s, {tokens / seconds[side]:.0f} tokens/s)"
            for side in sides) + ": " + ", ".join(f"ours / {side} {row[f'ours_over_{side}']:.2f}x" for side in sides[1:])
              + f"; the same {tokens} ids", flush=True)
    print(f"\n{megabytes:.1f} MB of text, {rows[0]['tokens']} tokens, {args.threads} thread(s) a side, "
          + (f"tokenizers {__import__('tokenizers').__version__}" if args.hf
             else f"sentencepiece {__import__('sentencepiece').__version__}"))
    print("| side | MB/s (median; min-max) | tokens/s (median) |\n|---|---:|---:|")
    for side in sides:
        speeds = [megabytes / row[f"{side}_s"] for row in rows]
        tokens = [row["tokens"] / row[f"{side}_s"] for row in rows]
        print(f"| {side} | {statistics.median(speeds):.1f} ({min(speeds):.1f}-{max(speeds):.1f}) | "
              f"{statistics.median(tokens):,.0f} |")
    for side in sides[1:]:
        ratios = [row[f"ours_over_{side}"] for row in rows]
        print(f"\nours / {side} (throughput): median {statistics.median(ratios):.2f}x, "
              f"min {min(ratios):.2f}x, max {max(ratios):.2f}x over {len(rows)} runs")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"threads": args.threads, "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
