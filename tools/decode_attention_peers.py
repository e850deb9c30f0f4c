#!/usr/bin/env python3
"""Peers of EKVA's CUDA decode attention, timed on the GPU machine in the same run.

* PyTorch SDPA with the cuDNN and the flash backends on equivalent dense tensors, K and V
  [B, 8, L, 128], with q in two forms: "rows", the 4 query heads of each KV head as 4 query rows of
  that head (q [B, 8, 4, 128]; decode needs no mask), and "gqa", the usual call (q [B, 32, 1, 128]
  with enable_gqa=True). Both give the same outputs and read every K/V byte once, as the paged
  kernel does; a library may run them with different kernels, so each is timed.
* A Triton kernel of the same ragged paged computation (EKVA's layout: a page holds page_size K rows
  then page_size V rows of one (sequence, KV head); block tables with per-segment offsets), split-K
  plus a reduction.

Timing as the C++ benchmark: CUDA graphs of several calls rotating over input replicas (so that the
L2 never holds the working set), CUDA events, warm-up, median of repetitions. Writes JSON.

  python3 tools/decode_attention_peers.py --out peers.json [--ekva ekva.json --table table.md]
"""
import argparse
import json
import math
import statistics

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

HQ, HKV, D, PAGE = 32, 8, 128, 16
G = HQ // HKV
ROTATION_BYTES = 1 << 30


@triton.jit
def _paged_decode_split(Q, Pool, PageIds, PageOffsets, Lengths, PartO, PartM, PartL, chunk,
                        num_splits, scale_log2, PAGE: tl.constexpr, D: tl.constexpr,
                        G: tl.constexpr, GP: tl.constexpr, BLOCK: tl.constexpr):
    seg = tl.program_id(0)
    split = tl.program_id(1)
    length = tl.load(Lengths + seg)
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    heads = tl.arange(0, GP)
    dims = tl.arange(0, D)
    q = tl.load(Q + (seg * G + heads[:, None]) * D + dims[None, :], mask=heads[:, None] < G,
                other=0.0)
    m = tl.full([GP], float("-inf"), tl.float32)
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    first_page = tl.load(PageOffsets + seg)
    for block in range(start, end, BLOCK):
        toks = block + tl.arange(0, BLOCK)
        valid = toks < end
        page = tl.load(PageIds + first_page + toks // PAGE, mask=valid, other=0)
        base = (page.to(tl.int64) * 2 * PAGE + toks % PAGE) * D
        k = tl.load(Pool + base[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(Pool + base[:, None] + PAGE * D + dims[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale_log2
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m = m_new
    row = (seg * num_splits + split) * G + heads
    tl.store(PartO + row[:, None] * D + dims[None, :], acc, mask=heads[:, None] < G)
    tl.store(PartM + row, m, mask=heads < G)
    tl.store(PartL + row, l, mask=heads < G)


@triton.jit
def _paged_decode_reduce(PartO, PartM, PartL, Out, num_splits, G: tl.constexpr, D: tl.constexpr,
                         SPLITS: tl.constexpr):
    seg = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS)
    dims = tl.arange(0, D)
    mask = sp < num_splits
    row = (seg * num_splits + sp) * G + h
    m = tl.load(PartM + row, mask=mask, other=float("-inf"))
    l = tl.load(PartL + row, mask=mask, other=0.0)
    top = tl.max(m, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(m - top)
    o = tl.load(PartO + row[:, None] * D + dims[None, :], mask=mask[:, None], other=0.0)
    total = tl.sum(l * w, 0)
    out = tl.sum(o * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(Out + (seg * G + h) * D + dims, out.to(tl.bfloat16))


class TritonPaged:
    def __init__(self, lengths, block=64, warps=4, stages=2):
        self.lengths = lengths
        total = int(lengths.sum())
        self.chunk = max(256, math.ceil(total / (132 * 4) / block) * block)
        self.splits = max(1, math.ceil(int(lengths.max()) / self.chunk))
        segs = lengths.numel()
        dev = lengths.device
        self.part_o = torch.empty(segs * self.splits * G, D, device=dev, dtype=torch.float32)
        self.part_m = torch.empty(segs * self.splits * G, device=dev, dtype=torch.float32)
        self.part_l = torch.empty_like(self.part_m)
        self.block, self.warps, self.stages = block, warps, stages

    def __call__(self, q, pool, page_ids, page_offsets, out):
        segs = self.lengths.numel()
        _paged_decode_split[(segs, self.splits)](
            q, pool, page_ids, page_offsets, self.lengths, self.part_o, self.part_m, self.part_l,
            self.chunk, self.splits, math.log2(math.e) / math.sqrt(D), PAGE=PAGE, D=D, G=G, GP=16,
            BLOCK=self.block, num_warps=self.warps, num_stages=self.stages)
        _paged_decode_reduce[(segs, G)](self.part_o, self.part_m, self.part_l, out, self.splits,
                                        G=G, D=D, SPLITS=triton.next_power_of_2(self.splits))


def make_paged(lengths, replicas, gen):
    """Pool and shuffled block tables for `replicas` disjoint copies of the same lengths."""
    pages_per_seg = (lengths + PAGE - 1) // PAGE
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device="cuda")
    offsets[1:] = torch.cumsum(pages_per_seg, 0)
    pages = int(offsets[-1])
    pool = torch.empty(pages * replicas, 2, PAGE, D, dtype=torch.bfloat16, device="cuda")
    pool.uniform_(-1, 1, generator=gen)
    perm = torch.randperm(pages * replicas, device="cuda", generator=gen).to(torch.int32)
    tables = [perm[r * pages:(r + 1) * pages].contiguous() for r in range(replicas)]
    return pool, tables, offsets


def reference(q, pool, table, offsets, lengths):
    """fp32 attention of each segment's query rows over its gathered K/V."""
    out = torch.empty(lengths.numel(), G, D, dtype=torch.float32, device="cuda")
    for s in range(lengths.numel()):
        n = int(lengths[s])
        slots = torch.arange(n, device="cuda")
        page = table[int(offsets[s]) + slots // PAGE].long()
        k = pool[page, 0, slots % PAGE].float()
        v = pool[page, 1, slots % PAGE].float()
        w = torch.softmax(q[s].float() @ k.T / math.sqrt(D), -1)
        out[s] = w @ v
    return out


def time_graph(calls, body, reps=9):
    """Median per-call milliseconds of replays of a CUDA graph of `calls` calls of body(i); where
    a library refuses capture, of eager calls between the same events."""
    try:
        return _time_graph(calls, body, reps)
    except Exception as e:  # noqa: BLE001 - capture refused: fall back, and say so
        print(f"graph capture failed ({str(e)[:120]}); timing eagerly", flush=True)
        torch.cuda.synchronize()
        for i in range(min(calls, 3)):
            body(i)
        times = []
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(calls):
                body(i)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / calls)
        return statistics.median(times)


def _time_graph(calls, body, reps):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(min(calls, 3)):
            body(i)  # warm-up outside the graph: compilation, cuDNN plans
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            body(i)
    graph.replay()
    graph.replay()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / calls)
    return statistics.median(times)


def check_triton(gen):
    lengths = torch.tensor([1, 17, 1000, 333, 64, 2049, 5, 100] * 2, dtype=torch.int32,
                           device="cuda")
    pool, tables, offsets = make_paged(lengths, 1, gen)
    q = torch.randn(lengths.numel(), G, D, dtype=torch.bfloat16, device="cuda", generator=gen)
    out = torch.empty_like(q)
    TritonPaged(lengths)(q, pool, tables[0], offsets, out)
    ref = reference(q, pool, tables[0], offsets, lengths)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"Triton paged decode is off: relative error {err}"
    return err


def sdpa(form, q, k, v):
    """SDPA on q [B, 8, 4, 128] (the 4 query heads of each KV head) in one of the two forms; the
    output as [B, 8, 4, 128] either way."""
    if form == "rows":
        return F.scaled_dot_product_attention(q, k, v)
    b = q.shape[0]
    out = F.scaled_dot_product_attention(q.reshape(b, HQ, 1, D), k, v, enable_gqa=True)
    return out.reshape(b, HKV, G, D)


def check_sdpa(backend, form, gen):
    q = torch.randn(2, HKV, G, D, dtype=torch.bfloat16, device="cuda", generator=gen)
    k = torch.randn(2, HKV, 3000, D, dtype=torch.bfloat16, device="cuda", generator=gen)
    v = torch.randn_like(k)
    with sdpa_kernel([backend]):
        out = sdpa(form, q, k, v)
    ref = torch.softmax(q.float() @ k.float().transpose(-1, -2) / math.sqrt(D), -1) @ v.float()
    return ((out.float() - ref).norm() / ref.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ekva", help="the C++ benchmark's JSON, for the side-by-side table")
    ap.add_argument("--table", help="write the side-by-side table (markdown) here")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(7)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__, "checks": {}, "attention": []}
    results["checks"]["triton_rel_err"] = check_triton(gen)
    # Peer name: (backend, q form); "cudnn" and "flash" keep the rows form of earlier runs.
    peers = {"cudnn": (SDPBackend.CUDNN_ATTENTION, "rows"),
             "flash": (SDPBackend.FLASH_ATTENTION, "rows"),
             "cudnn_gqa": (SDPBackend.CUDNN_ATTENTION, "gqa"),
             "flash_gqa": (SDPBackend.FLASH_ATTENTION, "gqa")}
    for name, (backend, form) in peers.items():
        try:
            results["checks"][f"{name}_rel_err"] = check_sdpa(backend, form, gen)
        except Exception as e:  # a backend that refuses the shape is reported, not fatal
            results["checks"][f"{name}_error"] = str(e)[:300]
    print(json.dumps(results["checks"]), flush=True)

    batches = [1, 8] if args.quick else [1, 8, 32, 64]
    contexts = [4096, 16384] if args.quick else [4096, 16384, 65536, 131072]
    for b in batches:
        for L in contexts:
            kv_bytes = b * HKV * L * D * 2 * 2
            replicas = max(1, min(16, ROTATION_BYTES // kv_bytes + 1))
            calls = max(replicas, min(64, max(2, int(2e9 // kv_bytes))))
            row = {"batch": b, "context": L, "kv_bytes": kv_bytes}
            qs = [torch.randn(b, HKV, G, D, dtype=torch.bfloat16, device="cuda", generator=gen)
                  for _ in range(replicas)]
            ks = [torch.empty(b, HKV, L, D, dtype=torch.bfloat16, device="cuda").uniform_(
                -1, 1, generator=gen) for _ in range(replicas)]
            vs = [torch.empty_like(k).uniform_(-1, 1, generator=gen) for k in ks]
            for name, (backend, form) in peers.items():
                if f"{name}_error" in results["checks"]:
                    continue
                try:
                    with sdpa_kernel([backend]):
                        ms = time_graph(calls, lambda i: sdpa(
                            form, qs[i % replicas], ks[i % replicas], vs[i % replicas]))
                    row[f"{name}_us"] = ms * 1e3
                except Exception as e:
                    row[f"{name}_error"] = str(e)[:200]
            del ks, vs
            torch.cuda.empty_cache()
            lengths = torch.full((b * HKV,), L, dtype=torch.int32, device="cuda")
            pool, tables, offsets = make_paged(lengths, replicas, gen)
            out = torch.empty(b, HKV, G, D, dtype=torch.bfloat16, device="cuda")
            best = None
            for block, warps, stages in [(64, 4, 2), (64, 4, 3), (32, 4, 3)]:
                kernel = TritonPaged(lengths, block, warps, stages)
                ms = time_graph(calls, lambda i: kernel(qs[i % replicas], pool,
                                                        tables[i % replicas], offsets, out))
                if best is None or ms < best[0]:
                    best = (ms, f"BLOCK={block} warps={warps} stages={stages}")
            row["triton_us"], row["triton_config"] = best[0] * 1e3, best[1]
            del pool, tables
            torch.cuda.empty_cache()
            results["attention"].append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)

    if args.ekva:
        with open(args.ekva) as f:
            ekva = {(r["batch"], r["context"]): r for r in json.load(f)["attention"]}
        lines = ["| B | L | K/V MB | EKVA us | EKVA TB/s | ragged/uniform | cuDNN us | cuDNN TB/s "
                 "| EKVA/cuDNN speed | cuDNN GQA us | EKVA/cuDNN GQA speed | flash us | flash TB/s "
                 "| flash GQA us | Triton us | Triton TB/s |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["attention"]:
            e = ekva.get((r["batch"], r["context"]))
            if e is None:
                continue
            by = r["kv_bytes"]

            def tbs(us):
                return f"{by / (us * 1e-6) / 1e12:.2f}" if us else "-"

            def us(key):
                return r.get(key)
            lines.append(
                f"| {r['batch']} | {r['context']} | {by / 1e6:.0f} | {e['uniform_us']:.1f} | "
                f"{tbs(e['uniform_us'])} | {e['ragged_us'] / e['uniform_us']:.3f} | "
                f"{us('cudnn_us') or 0:.1f} | {tbs(us('cudnn_us'))} | "
                f"{(us('cudnn_us') or 0) / e['uniform_us']:.2f} | {us('cudnn_gqa_us') or 0:.1f} | "
                f"{(us('cudnn_gqa_us') or 0) / e['uniform_us']:.2f} | {us('flash_us') or 0:.1f} | "
                f"{tbs(us('flash_us'))} | {us('flash_gqa_us') or 0:.1f} | {r['triton_us']:.1f} | "
                f"{tbs(r['triton_us'])} |")
        table = "\n".join(lines)
        print(table)
        if args.table:
            with open(args.table, "w") as f:
                f.write(table + "\n")


if __name__ == "__main__":
    main()
