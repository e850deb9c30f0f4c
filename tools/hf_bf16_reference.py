"""Runs transformers on each tiny checkpoint in bfloat16 (weights and activations) and writes its
logits beside the float32 reference, so that tests can bound a bf16 backend's error by what
transformers' own bf16 run gives on the same checkpoint.

usage: python3 tools/hf_bf16_reference.py FIXTURES_DIR OUT_DIR  (needs torch, transformers, a GPU)
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def relative_error(a, b):
    return float((a - b).abs().max() / b.abs().max())


def main(fixtures, out_dir):
    summary = {}
    for name in ["tiny-mixtral", "tiny-qwen2_moe", "tiny-qwen3_moe", "tiny-olmoe"]:
        src = os.path.join(fixtures, name)
        ref = load_file(os.path.join(src, "reference.safetensors"))
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).cuda().eval()
        with torch.no_grad():
            out = model(ref["input_ids"].cuda(), output_router_logits=True)
        logits = out.logits.float().cpu()
        routers = [r.float().cpu() for r in out.router_logits]
        tensors = {"logits": logits.contiguous()}
        errors = {"logits": relative_error(logits, ref["logits"])}
        for i, r in enumerate(routers):
            tensors[f"router_logits.{i}"] = r.contiguous()
            errors[f"router_logits.{i}"] = relative_error(r, ref[f"router_logits.{i}"])
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        save_file(tensors, os.path.join(out_dir, name, "reference_bf16.safetensors"),
                  metadata={"producer": "tools/hf_bf16_reference.py", "dtype": "bfloat16"})
        summary[name] = errors
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
