#!/usr/bin/env bash
# Writes the evaluation data that ships in the repository (data/eval/): a fixed set of task
# instances at 4096 tokens (the first instances of the set tools/make_shards.py evaluates on the
# GPU, same seed) and a sample of held-out corpus text (tools/build_corpus.sh).
# Usage: tools/make_eval_set.sh [path/to/ekva] [model dir]
set -euo pipefail
cd "$(dirname "$0")/.."
ekva=${1:-build/src/cli/ekva}
model=${2:-models/ekva-moe-8m}
mkdir -p data/eval
for task in passkey kv-retrieval multikey-needle variable-tracking; do
  "$ekva" tasks --task "$task" --context 4064 --count 6 --seed 777001 \
    --tokenizer "$model/tokenizer.model" --out "data/eval/$task-4096.jsonl"
done
python3 - <<'PY'
import json
out, size = [], 0
with open("data/corpus/heldout.jsonl") as f:
    for line in f:
        doc = json.loads(line)
        if doc["source"] == "gcide":
            continue
        out.append(doc["text"][:20000])
        size += len(out[-1])
        if size > 150_000:
            break
with open("data/eval/heldout.txt", "w") as f:
    f.write("\n\n".join(out) + "\n")
PY
du -ch data/eval/* | tail -1
