#!/usr/bin/env python3
"""Cuts a SentencePiece tokenizer.model to a few hundred pieces, for the fuzz seed.

    tools/cut_sentencepiece_model.py IN.model OUT.model [NORMAL_PIECES]

The fixture model (mistral-v3, 32,768 pieces, 587 KB) made a seed that libFuzzer spent its time
copying and mutating and SentencePiece its time indexing; this keeps every kind of piece the loader
sees (unknown, the control tokens up to [/INST] and a few more, all 256 byte-fallback pieces, and the
NORMAL_PIECES highest-scoring normal pieces, 250 unless given) and every other field as it was, with
the trainer spec's vocab_size and user-defined symbols cut to match. It rewrites the protobuf wire
format directly, so it needs only Debian's python3 (no sentencepiece or protobuf module).
"""

import sys

UNKNOWN, CONTROL, BYTE, NORMAL = 2, 3, 6, 1
KEEP_CONTROL = 10  # <s>, </s>, [INST], [/INST] and the other named control tokens come first


def read_varint(data, i):
    value, shift = 0, 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def fields(data):
    """(field number, wire type, value, the field's bytes as they were) for each field."""
    i = 0
    while i < len(data):
        start = i
        key, i = read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 2:
            length, i = read_varint(data, i)
            value, i = data[i:i + length], i + length
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wire} at byte {start}")
        yield number, wire, value, data[start:i]


def length_delimited(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def piece_of(message):
    piece, kind = b"", NORMAL  # protobuf defaults: a piece without a type is NORMAL
    for number, _, value, _ in fields(message):
        if number == 1:
            piece = value
        elif number == 3:
            kind = value
    return piece, kind


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.strip().splitlines()[2].strip())
    source, target = sys.argv[1], sys.argv[2]
    normal_limit = int(sys.argv[3]) if len(sys.argv) == 4 else 250
    data = open(source, "rb").read()

    kept, names = [], set()
    counts = {CONTROL: 0, NORMAL: 0}
    for number, _, value, raw in fields(data):
        if number != 1:
            continue
        piece, kind = piece_of(value)
        if kind in counts:
            limit = KEEP_CONTROL if kind == CONTROL else normal_limit
            if counts[kind] >= limit:
                continue
            counts[kind] += 1
        kept.append(raw)
        names.add(piece)

    out = bytearray()
    pieces_written = False
    for number, _, value, raw in fields(data):
        if number == 1:
            if not pieces_written:  # the kept pieces, in their order, where the pieces were
                out += b"".join(kept)
                pieces_written = True
            continue
        if number != 2:
            out += raw
            continue
        spec = bytearray()  # TrainerSpec: vocab_size (4) and user_defined_symbols (30) follow the cut
        for inner, _, inner_value, inner_raw in fields(value):
            if inner == 4:
                spec += varint(4 << 3) + varint(len(kept))
            elif inner == 30 and inner_value not in names:
                continue
            else:
                spec += inner_raw
        out += length_delimited(2, bytes(spec))
    open(target, "wb").write(out)
    print(f"{target}: {len(kept)} pieces, {len(out)} bytes (from {len(data)})")


if __name__ == "__main__":
    main()
