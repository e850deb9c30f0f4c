#!/usr/bin/env bash
# Builds the training corpus for the embedded model from Debian packages: English prose and
# technical text, extracted to plain text, deduplicated by paragraph and split into train and
# held-out parts (documents are assigned whole, by a hash of their path, so no document straddles
# the split). Output: data/corpus/{train,heldout}.jsonl (ignored by git).
# Needs root for apt-get; CI never runs this.
set -euo pipefail
cd "$(dirname "$0")/.."

apt-get install -y --no-install-recommends linux-doc python3-doc dict-gcide fortunes fortunes-min \
  >/dev/null

out=data/corpus
mkdir -p "$out"
python3 tools/extract_corpus.py --out "$out" \
  --html /usr/share/doc/python3.11/html \
  --linux-doc /usr/share/doc/linux-doc \
  --gcide /usr/share/dictd/gcide.dict.dz \
  --fortunes /usr/share/games/fortunes
wc -c "$out"/train.jsonl "$out"/heldout.jsonl
