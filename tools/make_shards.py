#!/usr/bin/env python3
"""Makes the token shards that tools/train_moe.py trains on, here (the GPU machine has no corpus).

Corpus documents are tokenized as [BOS] text [EOS] and concatenated. Task instances come from
`ekva tasks` (the one definition of each task) and are tokenized as [BOS] prompt answer [EOS];
each length bucket is a matrix of rows of width L+1 (zero-padded) with a JSON index giving each
row's length, where its answer starts and its task. Shards are raw little-endian uint16 compressed
with xz; Python's standard library reads them on the GPU machine.
Needs the sentencepiece Python module (Debian: python3-sentencepiece).
"""
import argparse
import array
import json
import lzma
import os
import subprocess
import sys
import tempfile

import sentencepiece

TASKS = ["passkey", "multikey-needle", "kv-retrieval", "variable-tracking"]
# (bucket width, prompt lengths) with instances per task and prompt length; kv-retrieval, the
# hardest, gets three times as many.
BUCKETS = [(1024, [480, 984]), (2048, [1000, 2000]), (4096, [2000, 3000, 4056])]
PER_TASK = {1024: 400, 2048: 400, 4096: 500}
EVAL_PROMPT_TOKENS = 4064
EVAL_COUNTS = {"passkey": 100, "kv-retrieval": 100, "multikey-needle": 50, "variable-tracking": 50}
EVAL_SEED = 777001


def write_xz(path, values):
    data = array.array("H", values)
    if sys.byteorder != "little":
        data.byteswap()
    with lzma.open(path, "wb", preset=6) as f:
        f.write(data.tobytes())


def tokenize_documents(sp, path, max_tokens, keep):
    tokens = array.array("H")
    with open(path) as f:
        for i, line in enumerate(f):
            doc = json.loads(line)
            if not keep(i, doc):
                continue
            tokens.append(sp.bos_id())
            tokens.extend(sp.encode(doc["text"]))
            tokens.append(sp.eos_id())
            if len(tokens) >= max_tokens:
                break
    return tokens


def run_tasks(ekva, tokenizer, task, context, count, seed, filler=None):
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as out:
        cmd = [ekva, "tasks", "--task", task, "--context", str(context), "--count", str(count),
               "--seed", str(seed), "--out", out.name, "--tokenizer", tokenizer]
        if filler:
            cmd += ["--filler", filler]
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        with open(out.name) as f:
            return [json.loads(l) for l in f]


def task_rows(sp, instances, width, stats):
    rows = []
    for inst in instances:
        prompt = sp.encode(inst["context"] + inst["question"])
        full = [sp.bos_id()] + sp.encode(inst["context"] + inst["question"] + inst["answer"])
        full.append(sp.eos_id())
        if len(prompt) != inst["prompt_tokens"]:
            stats["count_mismatch"] += 1
        if full[1 : 1 + len(prompt)] != prompt or len(full) > width:
            stats["dropped"] += 1
            continue
        rows.append((full, 1 + len(prompt), TASKS.index(inst["task"])))
    return rows


def write_bucket(out_dir, name, width, rows):
    flat = array.array("H")
    for tokens, _, _ in rows:
        flat.extend(tokens)
        flat.extend([0] * (width - len(tokens)))
    write_xz(os.path.join(out_dir, f"{name}.bin.xz"), flat)
    index = {"width": width, "tasks": TASKS, "length": [len(t) for t, _, _ in rows],
             "answer_start": [a for _, a, _ in rows], "task": [k for _, _, k in rows]}
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(index, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-dir", default="models/ekva-moe-8m")
    ap.add_argument("--ekva", default="build-model/src/cli/ekva")
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--out", default="data/shards")
    ap.add_argument("--corpus-tokens", type=int, default=12_000_000)
    ap.add_argument("--parts", default="corpus,tasks",
                    help="what to make: corpus (corpus and held-out shards, filler text), tasks "
                    "(task buckets and the evaluation set; needs the filler text)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    os.makedirs(args.out, exist_ok=True)
    tokenizer = os.path.join(args.model_dir, "tokenizer.model")
    sp = sentencepiece.SentencePieceProcessor(model_file=tokenizer)

    filler = os.path.join(args.corpus, "filler.txt")
    if "corpus" in parts:
        make_corpus(sp, args, filler)
    if "tasks" in parts:
        make_tasks(sp, args, tokenizer, filler)


def make_corpus(sp, args, filler):
    # The dictionary is most of the corpus but the least like running text: keep a third of it.
    keep = lambda i, doc: doc["source"] != "gcide" or i % 3 == 0
    corpus = tokenize_documents(sp, os.path.join(args.corpus, "train.jsonl"), args.corpus_tokens,
                                keep)
    write_xz(os.path.join(args.out, "corpus.bin.xz"), corpus)
    heldout = tokenize_documents(sp, os.path.join(args.corpus, "heldout.jsonl"), 1 << 40,
                                 lambda i, doc: True)
    write_xz(os.path.join(args.out, "heldout.bin.xz"), heldout)
    print(f"corpus {len(corpus):,} tokens, held-out {len(heldout):,} tokens")

    # Prose filler for a quarter of the needle tasks, from training text only.
    with open(os.path.join(args.corpus, "train.jsonl")) as f, open(filler, "w") as out:
        for i, line in enumerate(f):
            doc = json.loads(line)
            if doc["source"] in ("linux-doc", "python-docs", "fortunes") and i % 7 == 0:
                out.write(doc["text"] + "\n\n")


def make_tasks(sp, args, tokenizer, filler):
    stats = {"count_mismatch": 0, "dropped": 0}
    seed = 1
    for width, contexts in BUCKETS:
        rows = []
        for context in contexts:
            for task in TASKS:
                n = PER_TASK[width] * (3 if task == "kv-retrieval" else 1)
                prose = n // 4 if task in ("passkey", "multikey-needle") else 0
                instances = run_tasks(args.ekva, tokenizer, task, context, n - prose, seed)
                if prose:
                    instances += run_tasks(args.ekva, tokenizer, task, context, prose, seed + 1,
                                           filler)
                seed += 2
                rows += task_rows(sp, instances, width + 1, stats)
        write_bucket(args.out, f"tasks-{width}", width + 1, rows)
        print(f"bucket {width}: {len(rows)} instances, {sum(len(r[0]) for r in rows):,} tokens")
    rows = []
    for task, n in EVAL_COUNTS.items():
        rows += task_rows(sp, run_tasks(args.ekva, tokenizer, task, EVAL_PROMPT_TOKENS, n,
                                        EVAL_SEED), 4097, stats)
    write_bucket(args.out, "eval-4096", 4097, rows)
    print(f"eval: {len(rows)} instances; {stats}")


if __name__ == "__main__":
    main()
