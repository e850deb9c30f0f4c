#!/usr/bin/env python3
"""Decode-step time of Hugging Face transformers (eager PyTorch, bf16, SDPA attention) on the
configurations `ekva bench` times, for issue 22's peer table.

The model is built from a config.json with seeded random bf16 weights made on the GPU (as `ekva
bench --random-weights` does; the GPU machine's disk cannot hold Mixtral's checkpoint). Each
sequence's cache is filled with `context` random K/V entries per layer (decode reads the same bytes
whatever they hold, as in `ekva bench`), then `--steps` decode steps of one token per sequence are
timed with CUDA events around the model call (logits included); the median is reported. Token ids
vary per sequence so that a batch routes as text does.

  python3 bench/peers/hf_decode.py --config tests/fixtures/configs/mixtral-8x7b/config.json \
      --batch 1,16 --context 4096 --steps 10 --warmup 2 --out hf-mixtral.json
"""
import argparse
import json
import statistics
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache


def build(config_path):
    config = AutoConfig.from_pretrained(config_path)
    config._attn_implementation = "sdpa"
    torch.manual_seed(1)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.eval()
    return config, model


def filled_cache(config, model, batch, context):
    kv_heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = DynamicCache(config=config)
    for layer in range(config.num_hidden_layers):
        k = torch.randn(batch, kv_heads, context, head_dim, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        cache.update(k, v, layer)
    return cache


def time_decode(config, model, batch, context, steps, warmup):
    cache = filled_cache(config, model, batch, context)
    seqs = torch.arange(batch, device="cuda")
    times = []
    with torch.inference_mode():
        for i in range(warmup + steps):
            position = context + i
            ids = ((seqs * 7919 + position * 104729) % config.vocab_size).view(batch, 1)
            positions = torch.full((batch, 1), position, device="cuda")
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True,
                  cache_position=torch.tensor([position], device="cuda"))
            end.record()
            end.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end) / 1e3)
    del cache
    torch.cuda.empty_cache()
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a config.json")
    p.add_argument("--batch", default="1,16", help="comma-separated batch sizes")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", required=True, help="JSON file to write")
    a = p.parse_args()
    config, model = build(a.config)
    rows = []
    for batch in (int(b) for b in a.batch.split(",")):
        try:
            step_s = time_decode(config, model, batch, a.context, a.steps, a.warmup)
        except torch.OutOfMemoryError as e:
            print(f"batch {batch}: out of GPU memory ({e})", file=sys.stderr)
            torch.cuda.empty_cache()
            rows.append({"batch": batch, "context": a.context, "error": "out of GPU memory"})
            continue
        print(f"{config.model_type} batch {batch:>3} context {a.context}: {1e3 * step_s:.2f} ms/step",
              file=sys.stderr)
        rows.append({"batch": batch, "context": a.context, "step_ms": 1e3 * step_s,
                     "tokens_per_s": batch / step_s})
    import transformers
    with open(a.out, "w") as f:
        json.dump({"peer": "transformers eager (sdpa, bf16)", "transformers": transformers.__version__,
                   "torch": torch.__version__, "config": a.config, "decode": rows}, f, indent=1)


if __name__ == "__main__":
    main()
