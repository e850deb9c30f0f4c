#!/usr/bin/env python3
"""Extracts plain text from the Debian documentation packages named by build_corpus.sh.

Each source file becomes one or more documents; paragraphs seen before (after normalising case and
whitespace) are dropped, and whole documents go to the held-out part by a hash of their name, so the
split is stable across runs. Writes train.jsonl and heldout.jsonl ({"source", "text"} per line).
Standard library only.
"""
import argparse
import gzip
import hashlib
import html.parser
import json
import os
import re

HELDOUT_PERCENT = 2


class SphinxText(html.parser.HTMLParser):
    """Text of the main body of a Sphinx page, with paragraphs separated by blank lines."""

    BLOCKS = {"p", "pre", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "div"}
    SKIP = {"script", "style"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts = []
        self.body_depth = 0  # >0 while inside <div role="main">
        self.skip_depth = 0
        self.in_pre = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div":
            if self.body_depth:
                self.body_depth += 1
            elif attrs.get("role") == "main":
                self.body_depth = 1
        if tag in self.SKIP:
            self.skip_depth += 1
        if tag == "pre":
            self.in_pre += 1
        if self.body_depth and tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skip_depth:
            self.skip_depth -= 1
        if tag == "pre" and self.in_pre:
            self.in_pre -= 1
        if self.body_depth and tag in self.BLOCKS:
            self.parts.append("\n\n")
        if tag == "div" and self.body_depth:
            self.body_depth -= 1

    def handle_data(self, data):
        if self.body_depth and not self.skip_depth:
            self.parts.append(data if self.in_pre else re.sub(r"\s+", " ", data))

    def text(self):
        return "".join(self.parts).replace("\u00b6", "")


def python_docs(root):
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".html"):
                path = os.path.join(dirpath, name)
                parser = SphinxText()
                with open(path, encoding="utf-8", errors="replace") as f:
                    parser.feed(f.read())
                yield path, parser.text()


RST_RULE = re.compile(r"^\s*([=\-~^*#+`'\".:_])\1{3,}\s*$")


def linux_docs(root):
    for dirpath, _, files in os.walk(os.path.join(root, "Documentation")):
        for name in sorted(files):
            if name.endswith(".rst.gz") or name.endswith(".txt.gz"):
                path = os.path.join(dirpath, name)
                with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                    lines = f.read().splitlines()
                # Drop section underlines and comment/directive lines; keep prose and code.
                kept = [l for l in lines if not RST_RULE.match(l) and not l.startswith(".. ")]
                yield path, "\n".join(kept)


def gcide_entries(path, per_document=200):
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    start = text.find("Begin file 1 of 26")
    entries = [e.strip() for e in re.split(r"\n\s*\n", text[start:]) if e.strip()]
    for i in range(0, len(entries), per_document):
        yield f"{path}#{i}", "\n\n".join(entries[i : i + per_document])


def fortunes(root, per_document=40):
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not os.path.isfile(path) or "." in name or "art" in name:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            items = [i.strip("\n") for i in f.read().split("\n%\n") if i.strip()]
        for i in range(0, len(items), per_document):
            yield f"{path}#{i}", "\n\n".join(items[i : i + per_document])


def normalise(paragraph):
    return re.sub(r"\s+", " ", paragraph).strip().lower()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--html", required=True)
    ap.add_argument("--linux-doc", required=True)
    ap.add_argument("--gcide", required=True)
    ap.add_argument("--fortunes", required=True)
    args = ap.parse_args()

    sources = [
        ("python-docs", python_docs(args.html)),
        ("linux-doc", linux_docs(args.linux_doc)),
        ("gcide", gcide_entries(args.gcide)),
        ("fortunes", fortunes(args.fortunes)),
    ]
    seen = set()
    counts = {}
    with open(os.path.join(args.out, "train.jsonl.tmp"), "w") as train, open(
        os.path.join(args.out, "heldout.jsonl.tmp"), "w"
    ) as heldout:
        for source, documents in sources:
            for name, text in documents:
                paragraphs = []
                for p in re.split(r"\n[ \t]*\n", text):
                    p = p.strip("\n").rstrip()
                    key = hashlib.sha1(normalise(p).encode()).digest()
                    if len(p.strip()) < 3 or key in seen:
                        continue
                    seen.add(key)
                    paragraphs.append(p)
                if not paragraphs:
                    continue
                doc = "\n\n".join(paragraphs)
                bucket = int(hashlib.sha1(name.encode()).hexdigest(), 16) % 100
                part = "heldout" if bucket < HELDOUT_PERCENT else "train"
                (heldout if part == "heldout" else train).write(
                    json.dumps({"source": source, "text": doc}) + "\n"
                )
                counts[(source, part)] = counts.get((source, part), 0) + len(doc)
    for part in ("train", "heldout"):
        os.replace(
            os.path.join(args.out, f"{part}.jsonl.tmp"), os.path.join(args.out, f"{part}.jsonl")
        )
    for (source, part), chars in sorted(counts.items()):
        print(f"{source:12s} {part:8s} {chars:>12,d} chars")


if __name__ == "__main__":
    main()
