#!/usr/bin/env python3
"""The PyTorch side of the executor benchmark: the same GPT-2 model and
training step as bench/exec_vs_torch/exec_bench.c, for a side-by-side
ratio on one GPU.

Model: token + position embedding, pre-norm blocks (layer norm, fused QKV
projection, causal scaled_dot_product_attention, output projection, layer
norm, MLP with tanh GELU), final layer norm, LM head tied to the token
embedding. Step: bf16 autocast forward, cross-entropy, backward, global
norm clipping at 1.0, fused AdamW (betas 0.9 / 0.95, eps 1e-8, weight decay
0.1 on matrices and embeddings), like Partita's train_step (torch_step.py,
shared with torch_llama.py).

Usage: torch_gpt.py --model models/gpt2-124m.json --mbs 16
                    [--mode eager|compile] [--warmup 5] [--steps 20]
Prints a summary and one machine-readable line:
  RESULT impl=torch mode=compile model=gpt2-124m mbs=16 tokens_per_s=...
         step_ms=... peak_gib=... reserved_gib=...
"""
import argparse
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_step


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn_hidden):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, ffn_hidden)
        self.mlp_proj = nn.Linear(ffn_hidden, hidden)

    def forward(self, x):
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(hidden, dim=2)
        shape = (batch, seq, self.heads, hidden // self.heads)
        q = q.view(shape).transpose(1, 2)
        k = k.view(shape).transpose(1, 2)
        v = v.view(shape).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, seq, hidden)
        x = x + self.proj(y)
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)),
                                        approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, shape):
        super().__init__()
        hidden = shape["hidden"]
        self.token_embedding = nn.Embedding(shape["vocab"], hidden)
        self.position_embedding = nn.Embedding(shape["seq"], hidden)
        self.blocks = nn.ModuleList(
            Block(hidden, shape["heads"], shape.get("ffn_hidden", 4 * hidden))
            for _ in range(shape["layers"]))
        self.final_norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, shape["vocab"], bias=False)
        if shape.get("tied_embeddings", True):
            self.head.weight = self.token_embedding.weight
        std = 0.02
        residual_std = std / math.sqrt(2 * shape["layers"])
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                is_residual = name.endswith("proj.weight")
                nn.init.normal_(p, std=residual_std if is_residual else std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, targets):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.final_norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]),
                               targets.view(-1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--mbs", type=int, required=True)
    parser.add_argument("--mode", choices=["eager", "compile"],
                        default="compile")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with open(args.model) as f:
        shape = json.load(f)
    device = "cuda"
    torch.manual_seed(0)
    model = GPT(shape).to(device)
    optimizer = torch_step.adamw(model)
    step_model = torch.compile(model) if args.mode == "compile" else model
    seq = shape["seq"]
    tokens, targets = torch_step.synthetic_batch(args.mbs, seq, shape["vocab"],
                                                 device)
    step = torch_step.training_step(model, step_model, optimizer, tokens,
                                    targets)
    timing = torch_step.time_steps(step, args.warmup, args.steps)
    step_s = timing.step_s
    tokens_per_s = args.mbs * seq / step_s
    peak, reserved = timing.peak_gib, timing.reserved_gib
    print(f"# torch {torch.__version__} {args.mode} on "
          f"{torch.cuda.get_device_name()}: {shape['name']}, mbs {args.mbs}, "
          f"seq {seq}, loss {timing.loss:.4f}")
    print(f"# {tokens_per_s:.0f} tokens/s, {1e3 * step_s:.2f} ms/step (median), "
          f"peak {peak:.2f} GiB allocated, {reserved:.2f} GiB reserved")
    print(f"RESULT impl=torch mode={args.mode} model={shape['name']} "
          f"mbs={args.mbs} tokens_per_s={tokens_per_s:.0f} "
          f"step_ms={1e3 * step_s:.3f} peak_gib={peak:.3f} "
          f"reserved_gib={reserved:.3f}")


if __name__ == "__main__":
    main()
