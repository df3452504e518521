"""The training step of the PyTorch benchmark peers (torch_gpt.py,
torch_llama.py) and its timing, one definition for both, the step
exec_bench.c times: zero grads, bf16 autocast forward, cross-entropy
(the model's forward returns it), backward, global-norm clipping at 1.0,
fused AdamW (betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on matrices and
embeddings, none on norms and biases); fp32 parameters and gradients.
"""
import statistics
import time
from dataclasses import dataclass

import torch


def adamw(model):
    """Fused AdamW over the model's parameters, decay on the matrices."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)


def synthetic_batch(mbs, seq, vocab, device):
    """Random tokens (a fixed seed) and their next tokens, mbs x seq."""
    generator = torch.Generator(device="cpu").manual_seed(1)
    window = torch.randint(0, vocab, (mbs, seq + 1),
                           generator=generator).to(device)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def training_step(model, forward, optimizer, tokens, targets):
    """The step as a function; forward is the model or its compiled
    form, model the module whose parameters are clipped."""
    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = forward(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss
    return step


@dataclass
class Timing:
    step_s: float        # the median timed step
    first_s: float       # the first warm-up step (a compile's included)
    warmup_s: float      # all warm-up steps
    loss: float          # the last step's
    peak_gib: float      # max_memory_allocated over the timed steps
    reserved_gib: float  # max_memory_reserved over the timed steps


def time_steps(step, warmup, steps):
    """Runs warmup steps, then times steps steps, each to its end on the
    GPU, and takes the median, as exec_bench and bench/exec_vs_llmc take
    theirs (one slow step moves none of the programs)."""
    start = time.perf_counter()
    first_s = 0.0
    for i in range(warmup):
        step()
        if i == 0:
            torch.cuda.synchronize()
            first_s = time.perf_counter() - start
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - start
    torch.cuda.reset_peak_memory_stats()
    step_times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        step_times.append(time.perf_counter() - start)
    return Timing(step_s=statistics.median(step_times), first_s=first_s,
                  warmup_s=warmup_s, loss=loss.item(),
                  peak_gib=torch.cuda.max_memory_allocated() / 2**30,
                  reserved_gib=torch.cuda.max_memory_reserved() / 2**30)
