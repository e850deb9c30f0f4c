#!/usr/bin/env python3
"""Measured ceilings and per-operator decode times on a GPU, for the roofline model.

Writes two JSON files:
* ceilings.json: device memory, a device-to-device copy (bytes counted read + write), a streaming
  read (sum of a bf16 buffer) and a dense bf16 GEMM, the figures of a hardware file's "measured"
  block;
* measured.json: the schema of `ekva roofline --measured` (docs/ROOFLINE.md): Mixtral-8x7B-shaped
  decode operators in PyTorch (bf16, random weights): qkv_proj, out_proj, router, lm_head, routed
  experts (eager, averaged over random top-2 routings), RMSNorm, decode attention (SDPA, the fastest
  of the cuDNN, flash and efficient backends) over a sweep of batch and context, and whole 32-layer
  decode steps.

Timing: every operator is captured in a CUDA graph of several calls that rotate over enough
replicas of its weights / KV (>= 1 GiB) that the L2 never holds the working set (a decode step reads
each layer's weights once); CUDA events; warm-up; median of repetitions. Graphs remove the host's
launch overhead; what each kernel still costs beyond its bytes and FLOPs is what a hardware file's
operator_latency_us records.

  python3 tools/roofline_measure.py --out DIR
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

H, HQ, HKV, D, E, TOPK, INTER, VOCAB = 4096, 32, 8, 128, 8, 2, 14336, 32000
ROTATION_BYTES = 1 << 30
DEV = "cuda"
BF16 = torch.bfloat16


def time_graph(step, calls, reps=15):
    """Median seconds per call of `step(i)` for i in range(calls), captured in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(calls):  # warm-up outside the graph (allocations, autotuning)
            step(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            step(i)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    del graph
    return statistics.median(times)


def replicas(nbytes):
    return max(2, min(16, -(-ROTATION_BYTES // max(nbytes, 1))))


def ceilings():
    free, total = torch.cuda.mem_get_info()
    n = 2 << 30  # 2 GiB buffers
    a = torch.empty(n, dtype=torch.uint8, device=DEV).fill_(1)
    b = torch.empty_like(a)
    copy_s = time_graph(lambda i: b.copy_(a), 4)
    x = a.view(BF16)
    acc = torch.empty((), dtype=torch.float32, device=DEV)
    read_s = time_graph(lambda i: torch.sum(x, dim=0, dtype=torch.float32, out=acc), 4)
    del a, b, x
    m = 8192
    p = torch.randn(m, m, dtype=BF16, device=DEV)
    q = torch.randn(m, m, dtype=BF16, device=DEV)
    r = torch.empty(m, m, dtype=BF16, device=DEV)
    gemm_s = time_graph(lambda i: torch.matmul(p, q, out=r), 8)
    return {
        "device": torch.cuda.get_device_name(),
        "memory_total_bytes": total,
        "memory_total_gib": total / 2**30,
        "copy_bytes_per_s": 2 * n / copy_s,
        "read_bytes_per_s": n / read_s,
        "bf16_gemm_flops": 2 * m**3 / gemm_s,
        "torch": torch.__version__,
    }


def linear_op(name, batch, k, n):
    reps = replicas(k * n * 2)
    ws = [torch.randn(k, n, dtype=BF16, device=DEV) * 0.02 for _ in range(reps)]
    xs = [torch.randn(batch, k, dtype=BF16, device=DEV) for _ in range(reps)]
    outs = [torch.empty(batch, n, dtype=BF16, device=DEV) for _ in range(reps)]
    t = time_graph(lambda i: torch.matmul(xs[i], ws[i], out=outs[i]), reps)
    return {"operator": name, "batch": batch, "time_s": t}


def route(batch, seed):
    """Random top-2 routing of `batch` tokens: {expert: (token rows, gate weights)}."""
    gen = torch.Generator().manual_seed(seed)
    gates, idx = torch.topk(torch.softmax(torch.randn(batch, E, generator=gen), -1), TOPK, dim=-1)
    return {e: ((idx == e).nonzero()[:, 0].to(DEV), gates[idx == e].to(DEV, BF16).unsqueeze(1))
            for e in sorted(set(idx.flatten().tolist()))}


def moe(x, out, routing, gate_up, down):
    """Routed experts as eager PyTorch: per touched expert gather, gate_up, SwiGLU, down, scatter."""
    out.zero_()
    for e, (rows, gate) in routing.items():
        h = x.index_select(0, rows) @ gate_up[e]
        a = F.silu(h[:, :INTER]) * h[:, INTER:]
        out.index_add_(0, rows, (a @ down[e]) * gate)


def experts_op(batch, seeds=8):
    """One MoE layer's routed experts, averaged over random routings (the expected number of
    distinct experts touched, as the roofline model assumes)."""
    layer_bytes = E * 3 * H * INTER * 2
    reps = max(2, min(4, -(-ROTATION_BYTES // layer_bytes)))
    gate_up = [[torch.randn(H, 2 * INTER, dtype=BF16, device=DEV) * 0.02 for _ in range(E)]
               for _ in range(reps)]
    down = [[torch.randn(INTER, H, dtype=BF16, device=DEV) * 0.02 for _ in range(E)]
            for _ in range(reps)]
    x = torch.randn(batch, H, dtype=BF16, device=DEV)
    out = torch.zeros(batch, H, dtype=BF16, device=DEV)
    times, touched = [], []
    for seed in range(seeds):
        routing = route(batch, 1000 * batch + seed)
        touched.append(len(routing))
        times.append(time_graph(lambda i: moe(x, out, routing, gate_up[i], down[i]), reps, reps=7))
    del gate_up, down
    return {"operator": "routed_experts", "batch": batch, "time_s": statistics.mean(times),
            "note": f"mean over {seeds} random top-2 routings, "
                    f"{statistics.mean(touched):.2f} of {E} experts touched on average"}


def rms_norm_op(batch):
    reps = 16
    xs = [torch.randn(batch, H, dtype=BF16, device=DEV) for _ in range(reps)]
    w = torch.ones(H, dtype=BF16, device=DEV)
    t = time_graph(lambda i: F.rms_norm(xs[i], (H,), w, 1e-5), reps)
    return {"operator": "attn_norm", "batch": batch, "time_s": t, "note": "F.rms_norm"}


def decode_step(batches, context, layers=32):
    """Whole Mixtral-8x7B-shaped decode steps (random bf16 weights, 32 layers, KV of `context`
    tokens): norms, fused QKV, RoPE-like rotation, KV append, SDPA attention, output projection,
    router, eager routed experts, final norm, LM head. One CUDA graph per step."""
    g, qd, kvd = HQ // HKV, HQ * D, HKV * D
    bmax = max(batches)

    def rand(*shape):
        return torch.empty(*shape, dtype=BF16, device=DEV).normal_(0, 0.02)

    weights = []
    for _ in range(layers):
        weights.append({"qkv": rand(H, qd + 2 * kvd), "o": rand(qd, H), "router": rand(H, E),
                        "gate_up": [rand(H, 2 * INTER) for _ in range(E)],
                        "down": [rand(INTER, H) for _ in range(E)],
                        "k": rand(bmax, HKV, context + 1, D), "v": rand(bmax, HKV, context + 1, D)})
    lm_head = rand(H, VOCAB)
    norm_w = torch.ones(H, dtype=BF16, device=DEV)
    rows = []
    for batch in batches:
        x0 = torch.randn(batch, H, dtype=BF16, device=DEV)
        x = torch.empty_like(x0)
        moe_out = torch.empty_like(x0)
        routings = [route(batch, 7 * l + batch) for l in range(layers)]
        cos = torch.randn(batch, HQ + HKV, D, dtype=BF16, device=DEV)

        def step(_):
            x.copy_(x0)
            for l, w in enumerate(weights):
                h = F.rms_norm(x, (H,), norm_w, 1e-5)
                qkv = h @ w["qkv"]
                qk = qkv[:, :qd + kvd].view(batch, HQ + HKV, D)
                qk = qk * cos + qk.roll(1, -1) * cos  # stands for RoPE: same bytes and kernels
                w["k"][:batch, :, context] = qk[:, HQ:]
                w["v"][:batch, :, context] = qkv[:, qd + kvd:].view(batch, HKV, D)
                q = qk[:, :HQ].reshape(batch, HKV, g, D)
                a = F.scaled_dot_product_attention(q, w["k"][:batch], w["v"][:batch])
                x.add_(a.reshape(batch, qd) @ w["o"])
                h = F.rms_norm(x, (H,), norm_w, 1e-5)
                torch.topk(h @ w["router"], TOPK, dim=-1)
                moe(h, moe_out, routings[l], w["gate_up"], w["down"])
                x.add_(moe_out)
            return F.rms_norm(x, (H,), norm_w, 1e-5) @ lm_head

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                          SDPBackend.EFFICIENT_ATTENTION]):
            t = time_graph(step, 1, reps=7)
        touched = statistics.mean(len(r) for r in routings)
        rows.append({"operator": "step", "batch": batch, "context": context, "time_s": t,
                     "note": f"whole decode step, eager PyTorch in one CUDA graph; "
                             f"{touched:.2f} experts touched per layer on average"})
        print(rows[-1], flush=True)
    del weights
    return rows


def attention_op(batch, context):
    """Decode attention: the 4 query heads of a KV head become 4 query rows, so K and V are read
    once per (sequence, KV head), as a GQA decode kernel does."""
    g = HQ // HKV
    kv_bytes = 2 * batch * HKV * context * D * 2
    reps = replicas(kv_bytes)
    qs = [torch.randn(batch, HKV, g, D, dtype=BF16, device=DEV) for _ in range(reps)]
    ks = [torch.randn(batch, HKV, context, D, dtype=BF16, device=DEV) for _ in range(reps)]
    vs = [torch.randn(batch, HKV, context, D, dtype=BF16, device=DEV) for _ in range(reps)]
    best = None
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                t = time_graph(lambda i: F.scaled_dot_product_attention(qs[i], ks[i], vs[i]), reps)
        except RuntimeError:
            continue
        if best is None or t < best[0]:
            best = (t, backend.name)
    del qs, ks, vs
    return {"operator": "attention", "batch": batch, "context": context, "time_s": best[0],
            "note": f"SDPA {best[1]}"}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    ceil = ceilings()
    print(json.dumps(ceil, indent=2), flush=True)
    rows = []
    for batch in (1, 16, 64):
        rows.append(linear_op("qkv_proj", batch, H, HQ * D + 2 * HKV * D))
        rows.append(linear_op("out_proj", batch, HQ * D, H))
        rows.append(linear_op("router", batch, H, E))
        rows.append(linear_op("lm_head", batch, H, VOCAB))
        rows.append(experts_op(batch))
        rows.append(rms_norm_op(batch))
        for r in rows[-6:]:
            print(r, flush=True)
    for batch in (1, 16, 64):
        for context in (1024, 4096, 16384):
            rows.append(attention_op(batch, context))
            print(rows[-1], flush=True)
    torch.cuda.empty_cache()
    rows += decode_step((1, 16), 4095)
    measured = {
        "hardware": "h200",
        "description": (f"Mixtral-8x7B-shaped decode operators in PyTorch {torch.__version__} "
                        f"on {ceil['device']}: bf16, CUDA graphs rotating over >= 1 GiB of "
                        "replicas, CUDA events, median of 15 (tools/roofline_measure.py)"),
        "measurements": rows,
    }
    with open(f"{args.out}/measured.json", "w") as f:
        json.dump(measured, f, indent=2)
    with open(f"{args.out}/ceilings.json", "w") as f:
        json.dump(ceil, f, indent=2)


if __name__ == "__main__":
    main()
