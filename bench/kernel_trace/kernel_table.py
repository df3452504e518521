#!/usr/bin/env python3
"""One training step kernel kind by kernel kind, for one program or two
side by side: reads the traces kernel_trace.c wrote (start, end, name per
kernel), cuts each into steps at a marker kernel (the first kernel of a
step: the embedding's forward), keeps the steps that ran an optimizer
kernel, drops the first WARMUP of those, and prints per kind the GPU time
per step, its share of the step's kernel time, and for the products and
attention the achieved TFLOP/s (from the model's own FLOP count, the same
for both programs). Kernel names are matched as CUPTI gives them
(mangled), so a kind is a keyword of the name.

Usage: kernel_table.py --model MODEL.json --mbs N [--by-name]
                       LABEL=TRACE [LABEL=TRACE]
--by-name adds, per program, every kernel name's median ms a step and
mean us a call (names up to 120 characters, so cuDNN's generated
kernels keep their tile and knob suffixes), largest first.
"""
import argparse
import collections
import json
import re
import statistics
import sys

# Kinds in the order they are tested: the first keyword that a name
# holds decides. Attention first (cuDNN's fused kernels name sm90 and
# wgmma), then every matrix product whatever its epilogue (bias, GELU,
# accumulate), then the rest (layer norm before the global gradient norm).
KINDS = [
    ("attention", ("attention", "flash", "fmha", "sdpa", "cudnn",
                   "softmax", "permute")),
    ("matrix products", ("gemm", "nvjet", "xmma", "cutlass", "cublas")),
    ("embedding", ("encoder", "embedding", "wte", "wpe")),
    ("layer norm + residual", ("layernorm", "layer_norm", "residual",
                               "add_inplace", "add_broadcast")),
    ("bias gradients", ("bias", "reduce_add_sum")),
    ("classifier + loss", ("classifier", "crossentropy", "cross_entropy",
                           "vocab_parallel", "loss", "mean_kernel")),
    ("GELU", ("gelu",)),
    ("optimizer + grad norm", ("adam", "norm_squared", "global_norm",
                               "global_sum", "square_sum", "sum_chunk",
                               "sum_doubles", "refresh_mirror")),
    ("casts, copies, fills", ("copy", "memcpy", "cast", "convert", "memset",
                              "fill", "zero")),
]
# The first kernel of a step: the embedding's forward (llm.c, Partita);
# torch.compile's block scope shows none of its own, so its steps are cut
# at the loss's backward (Inductor's fused log-softmax backward, once a
# step): a cycle from one to the next still holds one of every kernel.
MARKERS = ("encoder_forward", "embedding_forward", "embedding_shard_forward",
           "log_softmax__log_softmax_backward_data")
OPTIMIZER = ("adam",)


def short_name(name):
    """The identifier of a mangled name (_Z18adamw_kernel... ->
    adamw_kernel; a nested one, _ZN5cudnn6fusion9matmul_dq..., with its
    namespaces: cudnn::fusion::matmul_dq)."""
    if name.startswith("_ZN"):
        parts, at = [], 3
        while at < len(name):
            match = re.match(r"\d+", name[at:])
            if not match:
                break
            length = int(match.group(0))
            start = at + match.end()
            parts.append(name[start:start + length])
            at = start + length
        if parts:
            return "::".join(parts)
    match = re.match(r"_Z(\d+)", name)
    if match:
        length = int(match.group(1))
        start = match.end()
        return name[start:start + length]
    return re.sub(r"[(<].*", "", name)[:60]


def kind_of(name):
    lowered = name.lower()
    for kind, keywords in KINDS:
        if any(word in lowered for word in keywords):
            return kind
    return "other"


def read_trace_rows(path):
    """Every kernel of a trace as a dict: start, end, device, stream,
    launch, name (traces written before device and stream were recorded
    read as GPU 0, stream 0; before the launch, as "-")."""
    rows = []
    with open(path) as f:
        columns = next(f).rstrip("\n").split("\t")
        for line in f:
            fields = line.rstrip("\n").split("\t", len(columns) - 1)
            raw = dict(zip(columns, fields))
            rows.append({"start": int(raw["start_ns"]),
                         "end": int(raw["end_ns"]),
                         "device": int(raw.get("device", 0)),
                         "stream": int(raw.get("stream", 0)),
                         "launch": raw.get("launch", "-"),
                         "name": raw["name"]})
    return rows


def read_trace(path):
    kernels = [(r["start"], r["end"], r["name"])
               for r in read_trace_rows(path)]
    kernels.sort()
    return kernels


def steps_of(kernels, warmup):
    """Lists of kernels, one per training step after the warm-up ones."""
    steps, current = [], None
    for kernel in kernels:
        lowered = kernel[2].lower()
        if any(marker in lowered for marker in MARKERS):
            if current is not None:
                steps.append(current)
            current = []
        if current is not None:
            current.append(kernel)
    if current:
        steps.append(current)
    training = [s for s in steps
                if any(any(o in k[2].lower() for o in OPTIMIZER) for k in s)]
    return training[warmup:]


def idle_ms(step):
    """Milliseconds of the step's span with nothing running on the GPU."""
    idle, busy_until = 0, step[0][1]
    for start, end, _ in step[1:]:
        if start > busy_until:
            idle += start - busy_until
        busy_until = max(busy_until, end)
    return idle / 1e6


def long_name(name):
    """The identifier, or an unmangled name up to 120 characters."""
    if name.startswith("_Z"):
        return short_name(name)
    return re.sub(r"[(<].*", "", name)[:120]


def per_name(steps):
    """Each kernel name's median ms a step and mean us a call."""
    per_step = []
    calls = collections.Counter()
    spent = collections.Counter()
    for step in steps:
        totals = collections.defaultdict(float)
        for start, end, name in step:
            key = long_name(name)
            totals[key] += (end - start) / 1e6
            calls[key] += 1
            spent[key] += (end - start) / 1e3
        per_step.append(totals)
    names = {k for totals in per_step for k in totals}
    return {k: (statistics.median(t.get(k, 0.0) for t in per_step),
                spent[k] / calls[k], calls[k] / len(steps))
            for k in names}


def print_by_name(label, steps):
    print(f"\n{label}: every kernel, ms a step (median), us a call "
          "(mean), calls a step")
    print("| kind | kernel | ms/step | us/call | calls/step |")
    print("|---|---|---|---|---|")
    rows = sorted(per_name(steps).items(), key=lambda item: -item[1][0])
    for name, (ms, us, calls) in rows:
        print(f"| {kind_of(name)} | {name} | {ms:.3f} | {us:.1f} | "
              f"{calls:.1f} |")


def per_kind(steps):
    """Median milliseconds per step of each kind, the step's wall time
    from its first kernel's start to its last kernel's end, the GPU's
    idle time inside a step and from a step's last record to the next
    step's first kernel (medians, ms; negative where a fill of the next
    step runs beside its first kernels), and the names seen in each
    kind."""
    per_step = []
    names = collections.defaultdict(collections.Counter)
    walls, idles = [], []
    for step in steps:
        totals = collections.defaultdict(float)
        for start, end, name in step:
            kind = kind_of(name)
            totals[kind] += (end - start) / 1e6
            names[kind][short_name(name)] += 1
        per_step.append(totals)
        walls.append((step[-1][1] - step[0][0]) / 1e6)
        idles.append(idle_ms(step))
    between = [(b[0][0] - max(e for _, e, _ in a)) / 1e6
               for a, b in zip(steps, steps[1:])] or [0.0]
    kinds = {k for totals in per_step for k in totals}
    medians = {k: statistics.median(t.get(k, 0.0) for t in per_step)
               for k in kinds}
    gaps = (statistics.median(idles), statistics.median(between))
    return medians, statistics.median(walls), gaps, names


def model_flops(model_path, mbs):
    """FLOPs of one step: products (6 x matrix parameters per token, the
    LM head over the vocabulary padded to 128) and causal attention
    (6 x layers x seq x hidden per token: Q K^T and P V, forward and
    backward, half of the square)."""
    with open(model_path) as f:
        m = json.load(f)
    h, layers, seq, vocab = m["hidden"], m["layers"], m["seq"], m["vocab"]
    ffn = m.get("ffn_hidden", 4 * h)
    padded = (vocab + 127) // 128 * 128
    tokens = mbs * seq
    products = 6.0 * tokens * (layers * (4 * h * h + 2 * h * ffn) + padded * h)
    attention = 6.0 * tokens * layers * seq * h
    return {"matrix products": products, "attention": attention}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--mbs", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--by-name", action="store_true")
    parser.add_argument("traces", nargs="+", help="LABEL=TRACE.tsv")
    args = parser.parse_args()
    flops = model_flops(args.model, args.mbs)
    columns = []
    for item in args.traces:
        if "=" not in item:
            parser.error(f"{item}: expected LABEL=TRACE.tsv")
        label, path = item.split("=", 1)
        steps = steps_of(read_trace(path), args.warmup)
        if not steps:
            sys.exit(f"kernel_table: {path}: no training step found")
        medians, wall, gaps, names = per_kind(steps)
        columns.append((label, medians, wall, gaps, names, len(steps),
                        steps))
    kinds = [k for k, _ in KINDS] + ["other"]
    header = "| kind |" + "".join(
        f" {c[0]} ms/step | share | TFLOP/s |" for c in columns)
    if len(columns) == 2:
        header += f" {columns[1][0]} / {columns[0][0]} |"
    print(header)
    print("|---|" + "---|---|---|" * len(columns) +
          ("---|" if len(columns) == 2 else ""))
    for kind in kinds:
        if all(kind not in c[1] for c in columns):
            continue
        row = f"| {kind} |"
        for _, medians, _, _, _, _, _ in columns:
            ms = medians.get(kind, 0.0)
            total = sum(medians.values())
            rate = (f"{flops[kind] / (ms / 1e3) / 1e12:.0f}"
                    if kind in flops and ms > 0 else "")
            row += f" {ms:.2f} | {100 * ms / total:.1f} % | {rate} |"
        if len(columns) == 2:
            a = columns[0][1].get(kind, 0.0)
            b = columns[1][1].get(kind, 0.0)
            row += f" {b / a:.2f} |" if a > 0 else " - |"
        print(row)
    print("| all kernels |" + "".join(
        f" {sum(c[1].values()):.2f} | 100 % | |" for c in columns))
    summary_rows = (
        ("step (first kernel to last)", lambda c: f"{c[2]:.2f}"),
        ("GPU idle a step (nothing running)",
         lambda c: f"{c[3][0] + max(c[3][1], 0.0):.3f}"),
    )
    for title, value in summary_rows:
        print(f"| {title} |" + "".join(f" {value(c)} | | |" for c in columns))
    for label, _, _, _, names, count, _ in columns:
        print(f"\n{label}: {count} steps; kernels of each kind (calls over "
              "the steps kept)")
        for kind in kinds:
            if kind in names:
                listed = ", ".join(f"{n} x{c}" for n, c in
                                   names[kind].most_common(8))
                print(f"- {kind}: {listed}")
    if args.by_name:
        for column in columns:
            print_by_name(column[0], column[6])


if __name__ == "__main__":
    main()
