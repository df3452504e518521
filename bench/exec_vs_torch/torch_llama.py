#!/usr/bin/env python3
"""Trains the model of a Partita model file in PyTorch, as exec_bench does.

The PyTorch side of the Llama benchmark (run_llama.sh): the model a
Partita model file describes, trained by the same step as exec_bench.c
and torch_gpt.py (torch_step.py), for a side-by-side ratio on one GPU.

Model (every field of the file, docs/formats.md "Model"; the tensors are
llama_shape.parameter_tensors's and checked against it): token embedding
(plus a learned position embedding where "positions" is "learned"),
pre-norm blocks (RMSNorm with norm_eps or LayerNorm; one fused q/k/v
projection of h + 2 kv_heads x head size rows, rotary positions on q and
k, rotate-half, at rope_base; causal scaled_dot_product_attention with
grouped-query heads through enable_gqa where the torch has it, else K/V
repeated; output projection; SwiGLU with one fused gate/up product or
tanh GELU), final norm, a head tied to the token embedding or its own;
biases as "bias" and "qkv_bias" say. Step, as torch_gpt.py's: zero
grads, bf16 autocast forward, cross-entropy, backward, global-norm
clipping at 1.0, fused AdamW (betas 0.9 / 0.95, eps 1e-8, weight decay
0.1 on matrices and embeddings); fp32 parameters and gradients.

Usage: torch_llama.py --model models/llama3.2-1b.json --mbs 4
           [--seq 2048] [--layers N] [--mode compile|eager]
           [--scope model|block] [--residual fp32|bf16]
           [--warmup 5] [--steps 20]
       torch_llama.py --model M [--seq N] [--layers N] --count-only
Prints a summary and one machine-readable line:
  RESULT impl=torch mode=compile model=... mbs=... tokens_per_s=...
         step_ms=... peak_gib=... reserved_gib=... seq=... layers=...
         scope=... residual=...
--count-only builds the model on the meta device (no GPU, no memory),
checks its tensors against llama_shape.py's and prints
  PARAMETERS model=... parameters=N source=torch
Exit status: 0; 1 on failure; 2 for a bad model file; 3 when the GPU ran
out of memory (run_llama.sh then tries fewer layers); 77 when no GPU is
visible.
"""
import argparse
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import llama_shape
import torch_step

EXIT_OUT_OF_MEMORY = 3


class Norm(nn.Module):
    """RMSNorm (a weight) or LayerNorm (a weight and a bias), returning
    the input's dtype: fp32 in, fp32 out under autocast's fp32 residual,
    bf16 in, bf16 out under --residual bf16 (as Partita's norms)."""

    def __init__(self, shape):
        super().__init__()
        self.hidden = shape["hidden"]
        self.eps = shape["norm_eps"]
        self.rms = shape["norm"] == "rmsnorm"
        self.weight = nn.Parameter(torch.ones(self.hidden))
        self.bias = None if self.rms else nn.Parameter(torch.zeros(self.hidden))

    def forward(self, x):
        if not self.rms:
            y = F.layer_norm(x, (self.hidden,), self.weight.to(x.dtype),
                             self.bias.to(x.dtype), self.eps)
        elif hasattr(F, "rms_norm"):
            y = F.rms_norm(x, (self.hidden,), self.weight.to(x.dtype),
                           self.eps)
        else:
            wide = x.float()
            y = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) +
                                   self.eps) * self.weight
        return y.to(x.dtype)


def rotate(t, cos, sin):
    """Rotary positions, rotate-half: channels i and i + d/2 of each head
    turned by position x base^(-2i/d); in fp32, rounded once to t's
    dtype. t: (batch, seq, heads, d); cos, sin: (seq, 1, d/2)."""
    wide = t.float()
    first, second = wide.chunk(2, dim=-1)
    turned = torch.cat((first * cos - second * sin,
                        first * sin + second * cos), dim=-1)
    return turned.to(t.dtype)


def sdpa_has_gqa():
    """Whether this torch's scaled_dot_product_attention takes
    enable_gqa (2.5 and later): tried on a tiny input."""
    try:
        q = torch.zeros(1, 2, 1, 8)
        kv = torch.zeros(1, 1, 1, 8)
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return True
    except TypeError:
        return False


class Attention(nn.Module):
    def __init__(self, shape, native_gqa):
        super().__init__()
        hidden = shape["hidden"]
        self.heads = shape["heads"]
        self.kv_heads = shape["kv_heads"]
        self.head_size = hidden // self.heads
        self.rope = shape["positions"] == "rope"
        self.native_gqa = native_gqa
        rows = (self.heads + 2 * self.kv_heads) * self.head_size
        self.qkv = nn.Linear(hidden, rows, bias=shape["qkv_bias"])
        self.proj = nn.Linear(hidden, hidden, bias=shape["bias"])

    def forward(self, x, cos, sin):
        batch, seq, hidden = x.shape
        qkv = self.qkv(x).view(batch, seq, self.heads + 2 * self.kv_heads,
                               self.head_size)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        if self.rope:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        grouped = self.kv_heads != self.heads
        if grouped and not self.native_gqa:
            repeat = self.heads // self.kv_heads
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        extra = {"enable_gqa": True} if grouped and self.native_gqa else {}
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, **extra)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, hidden))


class Mlp(nn.Module):
    """SwiGLU (gate and up one product of 2 f rows, silu(gate) x up) or
    tanh GELU."""

    def __init__(self, shape):
        super().__init__()
        hidden, ffn = shape["hidden"], shape["ffn_hidden"]
        self.swiglu = shape["mlp"] == "swiglu"
        rows = 2 * ffn if self.swiglu else ffn
        self.fc = nn.Linear(hidden, rows, bias=shape["bias"])
        self.proj = nn.Linear(ffn, hidden, bias=shape["bias"])

    def forward(self, x):
        if self.swiglu:
            gate, up = self.fc(x).chunk(2, dim=-1)
            return self.proj(F.silu(gate) * up)
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, shape, native_gqa):
        super().__init__()
        self.ln1 = Norm(shape)
        self.attn = Attention(shape, native_gqa)
        self.ln2 = Norm(shape)
        self.mlp = Mlp(shape)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln1(x), cos, sin)
        return x + self.mlp(self.ln2(x))


class Model(nn.Module):
    def __init__(self, shape, native_gqa=True, residual=torch.float32):
        super().__init__()
        hidden, vocab = shape["hidden"], shape["vocab"]
        self.residual = residual
        self.token_embedding = nn.Embedding(vocab, hidden)
        self.position_embedding = (nn.Embedding(shape["seq"], hidden)
                                   if shape["positions"] == "learned" else None)
        self.layers = nn.ModuleList(Block(shape, native_gqa)
                                    for _ in range(shape["layers"]))
        self.final_norm = Norm(shape)
        self.head = nn.Linear(hidden, vocab, bias=False)
        if shape["tied_embeddings"]:
            self.head.weight = self.token_embedding.weight
        self.register_buffer("cos", None, persistent=False)
        self.register_buffer("sin", None, persistent=False)
        if shape["positions"] == "rope":
            self.cos, self.sin = rotary_tables(shape)

    def initialise(self, layers):
        """GPT-2-like values (normal, std 0.02; residual projections
        0.02 / sqrt(2 layers); norms 1, biases 0): timing does not depend
        on them, only on their not being trivial."""
        residual_std = 0.02 / math.sqrt(2 * layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    std = residual_std if name.endswith("proj.weight") else 0.02
                    p.normal_(0.0, std)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.fill_(1.0)

    def forward(self, tokens, targets):
        x = self.token_embedding(tokens)
        if self.position_embedding is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = x + self.position_embedding(positions)
        x = x.to(self.residual)
        for block in self.layers:
            x = block(x, self.cos, self.sin)
        return self.loss(x, targets)

    def loss(self, x, targets):
        """Final norm, head and cross-entropy (fp32 under autocast)."""
        logits = self.head(self.final_norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]),
                               targets.view(-1))


def rotary_tables(shape):
    """cos and sin of position x base^(-2i/d), (seq, 1, d/2), fp32, on
    the default device (the caller's torch.device context); the angles
    in fp64 so that late positions keep their digits."""
    half = shape["hidden"] // shape["heads"] // 2
    exponents = torch.arange(half, dtype=torch.float64) / half
    frequencies = shape["rope_base"] ** -exponents
    positions = torch.arange(shape["seq"], dtype=torch.float64)
    angles = torch.outer(positions, frequencies).unsqueeze(1)
    return angles.cos().float(), angles.sin().float()


def check_tensors(model, shape):
    """The model's tensors are llama_shape's, names and dimensions (a
    tied head is the token embedding, once). Returns their count."""
    expected = llama_shape.parameter_tensors(shape)
    actual = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    if sorted(actual) != sorted(expected):
        missing = sorted(set(expected) - set(actual))[:3]
        extra = sorted(set(actual) - set(expected))[:3]
        raise SystemExit(f"torch_llama.py: {shape['name']}: the model's "
                         f"tensors differ from llama_shape.py's: missing "
                         f"{missing}, extra {extra}")
    return llama_shape.parameter_count(expected)


def compiled(model, mode, scope):
    """What the step calls for the forward under --mode and --scope: the
    whole model compiled (torch_gpt.py's way), or each block and the loss
    compiled on their own (the blocks share one compiled code: a compile
    of seconds where the whole model's grows with its layers, but nothing
    fused across a block's edge), or the model as it is (eager)."""
    if mode == "compile" and scope == "model":
        return torch.compile(model)
    if mode == "compile":
        for block in model.layers:
            block.compile()
        model.loss = torch.compile(model.loss)
    return model


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--mbs", type=int, default=1)
    parser.add_argument("--seq", type=int, help="replaces the file's seq")
    parser.add_argument("--layers", type=int,
                        help="replaces the file's layers (a stack of them)")
    parser.add_argument("--mode", choices=["eager", "compile"],
                        default="compile")
    parser.add_argument("--scope", choices=["model", "block"],
                        default="model",
                        help="what torch.compile compiles (default model, "
                             "as torch_gpt.py)")
    parser.add_argument("--residual", choices=["fp32", "bf16"],
                        default="fp32",
                        help="the residual stream's dtype: fp32 (autocast's, "
                             "torch_gpt.py's) or bf16 (Partita's)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--count-only", action="store_true",
                        help="build on the meta device, check the tensors, "
                             "print the parameter count; no GPU")
    args = parser.parse_args()
    if args.mbs < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--mbs and --steps must be at least 1, --warmup at "
                     "least 0")
    return args


def count_only(shape):
    with torch.device("meta"):
        model = Model(shape)
    count = check_tensors(model, shape)
    print(f"PARAMETERS model={shape['name']} parameters={count} source=torch")
    return 0


def train(args, shape):
    device = "cuda"
    torch.manual_seed(0)
    residual = torch.bfloat16 if args.residual == "bf16" else torch.float32
    native_gqa = sdpa_has_gqa()
    with torch.device(device):
        model = Model(shape, native_gqa, residual)
    count = check_tensors(model, shape)
    model.initialise(shape["layers"])
    optimizer = torch_step.adamw(model)
    seq = shape["seq"]
    tokens, targets = torch_step.synthetic_batch(args.mbs, seq, shape["vocab"],
                                                 device)
    step = torch_step.training_step(
        model, compiled(model, args.mode, args.scope), optimizer, tokens,
        targets)
    timing = torch_step.time_steps(step, args.warmup, args.steps)
    step_s = timing.step_s
    tokens_per_s = args.mbs * seq / step_s
    flops_per_token = 6.0 * count + 6.0 * shape["layers"] * seq * shape["hidden"]
    how = f"compile (scope {args.scope})" if args.mode == "compile" else "eager"
    print(f"# torch {torch.__version__} {how} on "
          f"{torch.cuda.get_device_name()}: {shape['name']}, {count} "
          f"parameters, mbs {args.mbs}, seq {seq}, residual {args.residual}, "
          f"attention {'enable_gqa' if native_gqa else 'K/V repeated'}, "
          f"loss {timing.loss:.4f}")
    if args.warmup > 0:
        print(f"# warm-up: first step {timing.first_s:.1f} s"
              f"{' (the compile included)' if args.mode == 'compile' else ''}, "
              f"{args.warmup} steps {timing.warmup_s:.1f} s")
    print(f"# {tokens_per_s:.0f} tokens/s, {1e3 * step_s:.2f} ms/step (median), "
          f"{flops_per_token * tokens_per_s / 1e12:.1f} TFLOP/s (6N + "
          f"attention), peak {timing.peak_gib:.2f} GiB allocated, "
          f"{timing.reserved_gib:.2f} GiB reserved")
    print(f"RESULT impl=torch mode={args.mode} model={shape['name']} "
          f"mbs={args.mbs} tokens_per_s={tokens_per_s:.0f} "
          f"step_ms={1e3 * step_s:.3f} peak_gib={timing.peak_gib:.3f} "
          f"reserved_gib={timing.reserved_gib:.3f} seq={seq} layers={shape['layers']} "
          f"scope={args.scope} residual={args.residual}")
    return 0


def main():
    args = parse_arguments()
    if int(torch.__version__.split(".")[0]) < 2:
        print(f"torch_llama.py: needs torch 2 or later (torch.compile, "
              f"device contexts); this is {torch.__version__}",
              file=sys.stderr)
        return 1
    try:
        _, shape = llama_shape.load(args.model, args.seq, args.layers)
    except (OSError, ValueError, llama_shape.ShapeError) as error:
        print(f"torch_llama.py: {error}", file=sys.stderr)
        return 2
    if args.count_only:
        return count_only(shape)
    if not torch.cuda.is_available():
        print("SKIP torch_llama.py: no CUDA device is visible")
        return 77
    try:
        return train(args, shape)
    except Exception as error:  # an OOM may come wrapped by the compiler
        text = str(error)
        if not isinstance(error, torch.cuda.OutOfMemoryError) and \
                "out of memory" not in text.lower():
            raise
        first_line = text.splitlines()[0] if text else type(error).__name__
        print(f"OUT_OF_MEMORY torch_llama.py: {shape['name']}, mbs "
              f"{args.mbs}: {first_line}")
        return EXIT_OUT_OF_MEMORY


if __name__ == "__main__":
    sys.exit(main())
