#!/usr/bin/env python3
"""Trains EKVA's embedded MoE models on the shards of tools/make_shards.py, on a GPU.

Two architectures (--arch), each written in plain PyTorch with Hugging Face's parameter names and
math, so the export loads in transformers and in EKVA's engine unchanged:
- mixtral (models/ekva-moe-8m): RMSNorm, rotate-half RoPE, GQA, top-2 of 8 experts with
  renormalised softmax weights (MixtralForCausalLM);
- qwen3_moe (models/ekva-qwen3moe-12m): the same plus per-head RMSNorm of queries and keys before
  RoPE, fine-grained routing (top-4 of 32 narrow experts, renormalised) (Qwen3MoeForCausalLM).
The experts are computed densely with the unselected experts' weights zeroed: the same function as
sparse dispatch, with static shapes and one matrix product per projection.

Training mixes corpus windows with task instances; task rows put extra weight on the answer tokens
and are followed by corpus text to fill the row. Sequence length grows over the run (1024, 2048,
4096), and the learning-rate schedule and curriculum follow wall-clock time, so a run fits its time
budget whatever the throughput. The model is exported to --out every --export-every seconds, so a
run cut short still leaves one.

After training (same process): held-out perplexity, routing statistics, teacher-forced task
accuracy (equal to greedy exact match of the answer) at 4096 tokens, and a parity fixture from
transformers' MixtralForCausalLM in float32 on the CPU.
"""
import argparse
import json
import lzma
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {}
CONFIGS["mixtral"] = {
    "arch": "mixtral",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "router_aux_loss_coef": 0.02,
    "router_z_loss_coef": 0.0,
    "norm_topk_prob": True,
    "qk_norm": False,
    "moe_module": "block_sparse_moe",
    "expert_names": ("w1", "w2", "w3"),  # gate, down, up
}
# Fine-grained routing: 32 experts of width 56, top-4 (the same 224 active expert columns per token
# as ekva-moe-8m's top-2 of 128), and the router z-loss of OLMoE beside the load-balancing loss.
CONFIGS["qwen3_moe"] = {
    "arch": "qwen3_moe",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 56,  # the experts' width (moe_intermediate_size in the export)
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "router_aux_loss_coef": 0.02,
    "router_z_loss_coef": 0.001,
    "norm_topk_prob": True,
    "qk_norm": True,
    "moe_module": "mlp",
    "expert_names": ("gate_proj", "down_proj", "up_proj"),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.heads
        d = c["hidden_size"]
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=False)
        self.qk_norm = c["qk_norm"]
        if self.qk_norm:  # Qwen3: RMSNorm over each head's query and key, before RoPE
            self.q_norm = RMSNorm(self.head_dim, c["rms_norm_eps"])
            self.k_norm = RMSNorm(self.head_dim, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = (q * cos + rotate_half(q) * sin).to(v.dtype)
        k = (k * cos + rotate_half(k) * sin).to(v.dtype)
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Expert(nn.Module):
    """A SwiGLU expert; its projections carry the architecture's names (gate, down, up)."""

    def __init__(self, d, inter, names):
        super().__init__()
        self.names = names
        setattr(self, names[0], nn.Linear(d, inter, bias=False))
        setattr(self, names[1], nn.Linear(inter, d, bias=False))
        setattr(self, names[2], nn.Linear(d, inter, bias=False))

    def proj(self, i):
        return getattr(self, self.names[i]).weight


class SparseMoe(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n, self.k = c["num_local_experts"], c["num_experts_per_tok"]
        self.norm_topk_prob = c["norm_topk_prob"]
        self.gate = nn.Linear(c["hidden_size"], self.n, bias=False)
        self.experts = nn.ModuleList(
            Expert(c["hidden_size"], c["intermediate_size"], c["expert_names"])
            for _ in range(self.n))

    def forward(self, x):
        b, t, d = x.shape
        x = x.reshape(-1, d)
        router_logits = self.gate(x)
        probs = F.softmax(router_logits, dim=-1, dtype=torch.float)
        top_w, top_i = probs.topk(self.k, dim=-1)
        if self.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(1, top_i, top_w).to(x.dtype)  # [N, E]
        w1 = torch.cat([e.proj(0) for e in self.experts], 0)  # gate [E*I, d]
        w3 = torch.cat([e.proj(2) for e in self.experts], 0)  # up [E*I, d]
        w2 = torch.cat([e.proj(1) for e in self.experts], 1)  # down [d, E*I]
        h = F.silu(x @ w1.t().to(x.dtype)) * (x @ w3.t().to(x.dtype))
        h = h.view(x.shape[0], self.n, -1) * weights.unsqueeze(-1)
        y = h.view(x.shape[0], -1) @ w2.t().to(x.dtype)
        return y.view(b, t, d), router_logits, probs, top_i


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.moe_name = c["moe_module"]
        setattr(self, self.moe_name, SparseMoe(c))
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y, logits, probs, top_i = getattr(self, self.moe_name)(self.post_attention_layernorm(x))
        return x + y, (logits, probs, top_i)


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class MoeLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        head_dim = c["hidden_size"] // c["num_attention_heads"]
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scale = 1 / math.sqrt(2 * c["num_hidden_layers"]) if name.endswith(
                    ("o_proj.weight", c["expert_names"][1] + ".weight")) else 1.0
                nn.init.normal_(p, std=std * scale)

    def forward(self, ids):
        t = ids.shape[1]
        freqs = torch.outer(torch.arange(t, device=ids.device).float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.model.embed_tokens(ids)
        routing = []
        for layer in self.model.layers:
            x, r = layer(x, cos, sin)
            routing.append(r)
        return self.lm_head(self.model.norm(x)), routing


def load_balancing_loss(routing, n_experts, k):
    # Hugging Face's load_balancing_loss_func, but per layer and averaged: over all layers' tokens
    # together it balances only the sum, and left experts of single layers nearly unused.
    total = 0.0
    for _, probs, top_i in routing:
        mask = F.one_hot(top_i, n_experts).float()  # [N, k, E]
        tokens_per_expert = mask.mean(0)
        prob_per_expert = probs.mean(0)
        total = total + (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * n_experts
    return total / len(routing)


def router_z_loss(routing):
    """OLMoE's router z-loss: the mean squared log-partition of the router logits, per layer."""
    return sum(torch.logsumexp(logits.float(), -1).pow(2).mean()
               for logits, _, _ in routing) / len(routing)


def min_load(routing, n_experts):
    """The least-used expert's share of the top-k slots in any layer, times the number of experts
    (1 when balanced, 0 when an expert got no token of the batch)."""
    with torch.no_grad():
        return min(torch.bincount(ti.reshape(-1), minlength=n_experts).min().item() /
                   ti.numel() * n_experts for _, _, ti in routing)


def read_u16(path):
    """A shard of little-endian uint16 tokens as an int32 tensor."""
    with lzma.open(path, "rb") as f:
        raw = bytearray(f.read())
    if sys.byteorder != "little":
        raw[0::2], raw[1::2] = raw[1::2], raw[0::2]
    return torch.frombuffer(raw, dtype=torch.int16).to(torch.int32) & 0xFFFF


class Bucket:
    """Task rows of one width on the GPU: tokens [n, width], lengths, answer starts, task ids."""

    def __init__(self, shards, name, device):
        with open(os.path.join(shards, f"{name}.json")) as f:
            index = json.load(f)
        self.width = index["width"]
        self.task_names = index["tasks"]
        self.tokens = read_u16(os.path.join(shards, f"{name}.bin.xz")).view(-1, self.width).to(
            device)
        self.length = torch.tensor(index["length"], device=device)
        self.answer_start = torch.tensor(index["answer_start"], device=device)
        self.task = torch.tensor(index["task"], device=device)

    def row_weights(self, task_weights):
        """Sampling weight of each row: its task's weight (1 for a task not named)."""
        per_task = torch.tensor([task_weights.get(t, 1.0) for t in self.task_names],
                                device=self.task.device)
        return per_task[self.task]


def make_batch(corpus, bucket, row_weights, rows, task_rows, gen):
    """Inputs and targets of rows x L tokens, and which targets are task answers: task rows first
    (an instance, then corpus text to fill the row), then corpus windows."""
    device = corpus.device
    width = bucket.width
    pos = torch.arange(width, device=device)
    starts = torch.randint(0, corpus.numel() - width, (rows,), device=device, generator=gen)
    seq = corpus[starts[:, None] + pos[None, :]]
    answer = torch.zeros(rows, width - 1, device=device, dtype=torch.bool)
    if task_rows:
        pick = torch.multinomial(row_weights, task_rows, replacement=True, generator=gen)
        length = bucket.length[pick][:, None]
        start = bucket.answer_start[pick][:, None]
        seq[:task_rows] = torch.where(pos[None, :] < length, bucket.tokens[pick],
                                      seq[:task_rows])
        tpos = pos[None, : width - 1]
        # target j predicts token j+1: the answer tokens and the EOS after them.
        answer[:task_rows] = (tpos >= start - 1) & (tpos < length - 1)
    return seq[:, :-1].long(), seq[:, 1:].long(), answer


def hf_config(c, tokenizer_ids):
    """config.json in the transformers-5 form of the model's architecture."""
    if c["arch"] == "qwen3_moe":
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": tokenizer_ids["bos"],
            "eos_token_id": tokenizer_ids["eos"],
            "pad_token_id": None,
            "decoder_sparse_step": 1,
            "dtype": "bfloat16",
            "head_dim": c["hidden_size"] // c["num_attention_heads"],
            "hidden_act": "silu",
            "hidden_size": c["hidden_size"],
            "initializer_range": 0.02,
            # Dense MLP width: unused, every layer is MoE (mlp_only_layers is empty).
            "intermediate_size": c["intermediate_size"] * c["num_experts_per_tok"],
            "max_position_embeddings": c["max_position_embeddings"],
            "mlp_only_layers": [],
            "moe_intermediate_size": c["intermediate_size"],
            "norm_topk_prob": c["norm_topk_prob"],
            "num_attention_heads": c["num_attention_heads"],
            "num_experts_per_tok": c["num_experts_per_tok"],
            "num_hidden_layers": c["num_hidden_layers"],
            "num_key_value_heads": c["num_key_value_heads"],
            "num_local_experts": c["num_local_experts"],  # what transformers 5 writes
            "output_router_logits": False,
            "rms_norm_eps": c["rms_norm_eps"],
            "rope_parameters": {"rope_theta": c["rope_theta"], "rope_type": "default"},
            "router_aux_loss_coef": c["router_aux_loss_coef"],
            "sliding_window": None,
            "tie_word_embeddings": False,
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": c["vocab_size"],
        }
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "attention_dropout": 0.0,
        "bos_token_id": tokenizer_ids["bos"],
        "eos_token_id": tokenizer_ids["eos"],
        "pad_token_id": None,
        "dtype": "bfloat16",
        "head_dim": c["hidden_size"] // c["num_attention_heads"],
        "hidden_act": "silu",
        "hidden_size": c["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": c["intermediate_size"],
        "max_position_embeddings": c["max_position_embeddings"],
        "num_attention_heads": c["num_attention_heads"],
        "num_experts_per_tok": c["num_experts_per_tok"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_key_value_heads": c["num_key_value_heads"],
        "num_local_experts": c["num_local_experts"],
        "output_router_logits": False,
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_parameters": {"rope_theta": c["rope_theta"], "rope_type": "default"},
        "router_aux_loss_coef": c["router_aux_loss_coef"],
        "router_jitter_noise": 0.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": c["vocab_size"],
    }


def export(model, tokenizer_ids, out_dir):
    from safetensors.torch import save_file
    config = hf_config(model.c, tokenizer_ids)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
             for k, v in model.state_dict().items()}
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def slot_counts(routing, n_experts):
    """[layers, E]: how many top-k slots each expert got."""
    return torch.stack([torch.bincount(ti.reshape(-1), minlength=n_experts).float()
                        for _, _, ti in routing])


@torch.no_grad()
def evaluate(model, shards, out_dir, device, log, eval_windows=64):
    model.eval()
    n_experts = model.c["num_local_experts"]
    results = {}
    # Held-out perplexity over 4096-token windows of held-out documents.
    heldout = read_u16(os.path.join(shards, "heldout.bin.xz")).to(device)
    win = 4096
    n_win = min(eval_windows, (heldout.numel() - 1) // win)
    nll, count = 0.0, 0
    load = None
    entropy = None
    for i in range(0, n_win, 8):
        idx = torch.arange(i, min(i + 8, n_win), device=device)
        seq = heldout[idx[:, None] * win + torch.arange(win + 1, device=device)[None, :]].long()
        with torch.autocast(device, dtype=torch.bfloat16):
            logits, routing = model(seq[:, :-1])
        nll += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                               seq[:, 1:].reshape(-1), reduction="sum").item()
        count += seq[:, 1:].numel()
        # Routing statistics: share of top-k slots per expert, and the entropy of the router's
        # distribution per token (ln E would be uniform, 0 a single expert).
        layer_load = slot_counts(routing, n_experts)
        layer_ent = torch.stack([-(p * p.clamp_min(1e-12).log()).sum(-1).sum()
                                 for _, p, _ in routing])
        load = layer_load if load is None else load + layer_load
        entropy = layer_ent if entropy is None else entropy + layer_ent
    results["heldout_tokens"] = count
    results["heldout_perplexity"] = math.exp(nll / count)
    load = load / load.sum(1, keepdim=True)
    results["expert_load"] = [[round(v, 4) for v in row] for row in load.tolist()]
    results["router_entropy"] = [round(v / count, 4) for v in entropy.tolist()]
    # Entropy of the per-layer expert load distribution, ln E when balanced.
    results["load_entropy"] = [round(-(r * r.clamp_min(1e-12).log()).sum().item(), 4)
                               for r in load]
    results["load_entropy_balanced"] = round(math.log(n_experts), 4)
    # Dead experts: no slot at all on the held-out text; starved: under a tenth of a fair share.
    results["dead_experts"] = [int((r == 0).sum().item()) for r in load]
    results["starved_experts"] = [int((r < 0.1 / n_experts).sum().item()) for r in load]

    # Tasks: teacher-forced argmax on every answer token equals greedy exact match of the answer.
    bucket = Bucket(shards, "eval-4096", device)
    correct = {}
    task_load = None
    for i in range(0, bucket.tokens.shape[0], 16):
        rows = torch.arange(i, min(i + 16, bucket.tokens.shape[0]), device=device)
        seq = bucket.tokens[rows].long()
        with torch.autocast(device, dtype=torch.bfloat16):
            logits, routing = model(seq[:, :-1])
        # Routing on the task prompts alone (the zero padding after each instance left out).
        real = (torch.arange(seq.shape[1] - 1, device=device)[None, :] <
                bucket.length[rows][:, None] - 1).reshape(-1)
        counts = slot_counts([(lg, p, ti[real]) for lg, p, ti in routing], n_experts)
        task_load = counts if task_load is None else task_load + counts
        pred = logits.argmax(-1)
        tpos = torch.arange(seq.shape[1] - 1, device=device)[None, :]
        start = bucket.answer_start[rows][:, None]
        length = bucket.length[rows][:, None]
        # Answer tokens only (not the EOS after them).
        in_answer = (tpos >= start - 1) & (tpos < length - 2)
        ok = ((pred == seq[:, 1:]) | ~in_answer).all(1)
        for task, good in zip(bucket.task[rows].tolist(), ok.tolist()):
            name = bucket.task_names[task]
            c = correct.setdefault(name, [0, 0])
            c[0] += int(good)
            c[1] += 1
    results["task_accuracy_4096"] = {k: round(v[0] / v[1], 4) for k, v in correct.items()}
    results["task_instances_4096"] = {k: v[1] for k, v in correct.items()}
    task_load = task_load / task_load.sum(1, keepdim=True)
    results["expert_load_tasks"] = [[round(v, 4) for v in row] for row in task_load.tolist()]
    results["load_entropy_tasks"] = [round(-(r * r.clamp_min(1e-12).log()).sum().item(), 4)
                                     for r in task_load]
    log(json.dumps(results))
    with open(os.path.join(out_dir, "eval.json"), "w") as f:
        json.dump(results, f, indent=2)
    model.train()


@torch.no_grad()
def parity_fixture(out_dir, shards, log):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    log(f"transformers loaded {type(hf).__name__}")
    heldout = read_u16(os.path.join(shards, "heldout.bin.xz")).long()
    T = 64
    ids = torch.stack([heldout[:T], heldout[1000:1000 + T]])
    out = hf(input_ids=ids, output_router_logits=True)
    fixture = {"input_ids": ids, "logits": out.logits.float().contiguous()}
    for i, r in enumerate(out.router_logits):
        fixture[f"router_logits.{i}"] = r.float().reshape(-1, r.shape[-1]).contiguous()
    prompt = heldout[2000:2016][None, :]
    seq = prompt
    for _ in range(24):
        nxt = hf(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    fixture["greedy_prompt"] = prompt.contiguous()
    fixture["greedy_output"] = seq[:, 16:].contiguous()
    save_file(fixture, os.path.join(out_dir, "reference.safetensors"), metadata={"format": "pt"})
    log(f"parity fixture: greedy {seq[0, 16:].tolist()}")
    return hf


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shards", default="data/shards")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=400)
    ap.add_argument("--export-every", type=float, default=90)
    ap.add_argument("--tokens-per-step", type=int, default=65536)
    ap.add_argument("--task-fraction", type=float, default=0.5)
    ap.add_argument("--answer-weight", type=float, default=4.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", help="model.safetensors to start from (a continued run)")
    ap.add_argument("--task-weights", default="",
                    help="sampling weights of task rows, e.g. kv-retrieval=4,passkey=1")
    ap.add_argument("--curriculum", default="0.15:1024,0.35:2048,1:4096",
                    help="sequence length until each fraction of the time")
    ap.add_argument("--warmup", type=float, default=0.03, help="fraction of the time")
    ap.add_argument("--arch", choices=sorted(CONFIGS), default="mixtral",
                    help="mixtral: ekva-moe-8m; qwen3_moe: ekva-qwen3moe-12m")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only for a smoke test")
    ap.add_argument("--eval-windows", type=int, default=64,
                    help="4096-token held-out windows for perplexity and routing statistics")
    args = ap.parse_args()
    config = CONFIGS[args.arch]
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "log.txt"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    t_start = time.time()
    device = args.device
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    corpus = read_u16(os.path.join(args.shards, "corpus.bin.xz")).to(device)
    buckets = {w: Bucket(args.shards, f"tasks-{w}", device) for w in (1024, 2048, 4096)}
    log(f"data: corpus {corpus.numel():,} tokens; task rows "
        f"{ {w: b.tokens.shape[0] for w, b in buckets.items()} }; load {time.time() - t_start:.1f}s")
    model = MoeLM(config).to(device)
    if args.init:
        from safetensors.torch import load_file
        model.load_state_dict({k: v.float() for k, v in load_file(args.init).items()})
        log(f"initialised from {args.init}")
    task_weights = {k: float(v) for k, v in
                    (item.split("=") for item in args.task_weights.split(",") if item)}
    row_weights = {w: b.row_weights(task_weights) for w, b in buckets.items()}
    curriculum = [(float(f), int(w)) for f, w in
                  (item.split(":") for item in args.curriculum.split(","))]
    n_params = sum(p.numel() for p in model.parameters())
    log(f"parameters {n_params:,}")
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda")
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    csv = open(os.path.join(args.out, "train_log.csv"), "w")
    csv.write("step,seconds,seq_len,lr,loss,answer_loss,aux_loss,z_loss,min_load,tokens,"
              "task_rows\n")
    tokenizer_ids = {"bos": 1, "eos": 2}
    step, tokens_seen, task_rows_seen, rows_seen = 0, 0, 0, 0
    t0 = time.time()
    last_export = t0
    warmup = args.warmup
    while True:
        frac = (time.time() - t0) / args.seconds
        if frac >= 1:
            break
        width = next(w for f, w in curriculum if frac < f)
        lr = args.lr * (frac / warmup if frac < warmup else
                        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (frac - warmup) / (1 - warmup))))
        for g in opt.param_groups:
            g["lr"] = lr
        rows = args.tokens_per_step // width
        # Task rows so far never exceed --task-fraction of all rows (16 rows of 4096 at 10%
        # rounded per batch would be 2, 12.5%): carry the fraction over from batch to batch.
        task_rows = math.floor((rows_seen + rows) * args.task_fraction) - task_rows_seen
        inputs, targets, answer = make_batch(corpus, buckets[width], row_weights[width], rows,
                                             task_rows, gen)
        with torch.autocast(device, dtype=torch.bfloat16):
            logits, routing = model(inputs)
        ce = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1),
                             reduction="none").view(targets.shape)
        loss_lm = ce.mean()
        answer_f = answer.float()
        loss_answer = (ce * answer_f).sum() / answer_f.sum().clamp_min(1)
        aux = load_balancing_loss(routing, config["num_local_experts"],
                                  config["num_experts_per_tok"])
        loss = loss_lm + args.answer_weight * loss_answer * (task_rows / rows) + \
            config["router_aux_loss_coef"] * aux
        z = router_z_loss(routing) if config["router_z_loss_coef"] else torch.zeros(())
        if config["router_z_loss_coef"]:
            loss = loss + config["router_z_loss_coef"] * z
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += inputs.numel()
        rows_seen += rows
        task_rows_seen += task_rows
        if step % 25 == 0 or step == 1:
            elapsed = time.time() - t0
            line = (f"{step},{elapsed:.1f},{width},{lr:.6f},{loss_lm.item():.4f},"
                    f"{loss_answer.item():.4f},{aux.item():.4f},{z.item():.4f},"
                    f"{min_load(routing, config['num_local_experts']):.3f},{tokens_seen},"
                    f"{task_rows_seen}")
            csv.write(line + "\n")
            csv.flush()
            if step % 100 == 0 or step == 1:
                log(f"step {step} t={elapsed:.0f}s L={width} lr={lr:.2e} lm={loss_lm.item():.3f} "
                    f"ans={loss_answer.item():.3f} aux={aux.item():.3f} z={z.item():.2f} "
                    f"tok/s={tokens_seen / elapsed:,.0f}")
        if time.time() - last_export > args.export_every:
            export(model, tokenizer_ids, args.out)
            last_export = time.time()
    log(f"trained {step} steps, {tokens_seen:,} tokens in {time.time() - t0:.0f}s; task rows "
        f"{task_rows_seen:,} of {rows_seen:,} ({task_rows_seen / max(rows_seen, 1):.2%})")
    export(model, tokenizer_ids, args.out)
    # The model is saved; a failure below is logged and leaves it in place.
    try:
        evaluate(model, args.shards, args.out, device, log, args.eval_windows)
    except Exception as e:  # noqa: BLE001
        log(f"evaluation failed: {e!r}")
    try:
        hf = parity_fixture(args.out, args.shards, log)
        from safetensors.torch import load_file
        ours = MoeLM(config)
        ours.load_state_dict({k: v.float() for k, v in
                              load_file(os.path.join(args.out, "model.safetensors")).items()})
        with torch.no_grad():
            ids = read_u16(os.path.join(args.shards, "heldout.bin.xz"))[:128].long()[None]
            mine = ours(ids)[0]
            theirs = hf(input_ids=ids).logits
        log(f"ours vs transformers max |diff| {(mine - theirs).abs().max().item():.2e} "
            f"(logit scale {theirs.abs().max().item():.1f})")
    except Exception as e:  # noqa: BLE001
        log(f"parity fixture failed: {e!r}")
    log(f"total {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
