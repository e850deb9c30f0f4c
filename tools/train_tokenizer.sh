#!/usr/bin/env bash
# Trains the embedded model's SentencePiece BPE tokenizer on the corpus (tools/build_corpus.sh).
# Digits are split so numbers are copied digit by digit; byte fallback makes every text encodable;
# identity normalisation keeps text (and its whitespace) as written.
set -euo pipefail
cd "$(dirname "$0")/.."
model_dir=${1:-models/ekva-moe-8m}
mkdir -p "$model_dir" data/corpus
# One paragraph per line: spm_train reads lines as sentences.
python3 - <<'PY'
import json
with open("data/corpus/train.jsonl") as f, open("data/corpus/tokenizer_input.txt", "w") as out:
    for line in f:
        for p in json.loads(line)["text"].split("\n\n"):
            p = p.replace("\n", " ").strip()
            if p:
                out.write(p[:4000] + "\n")
PY
spm_train --input=data/corpus/tokenizer_input.txt --model_prefix="$model_dir/tokenizer" \
  --model_type=bpe --vocab_size=4096 --byte_fallback=true --split_digits=true \
  --character_coverage=0.9995 --normalization_rule_name=identity --remove_extra_whitespaces=false \
  --allow_whitespace_only_pieces=true --input_sentence_size=150000 --shuffle_input_sentence=true \
  --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --num_threads=2 --minloglevel=0
rm "$model_dir/tokenizer.vocab"
