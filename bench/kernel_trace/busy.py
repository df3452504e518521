#!/usr/bin/env python3
"""Where a multi-GPU step's time goes, GPU by GPU: reads a trace that
kernel_trace.c wrote (start, end, device, stream, name per kernel), cuts
each GPU's kernels into steps at the embedding's forward (as
kernel_table.py does), drops the first WARMUP steps and prints per GPU
the mean step span, the time its kernels kept the GPU busy (the union of
their intervals), the idle rest, the time of communication kernels
(NCCL's and the device exchange's), how much of that ran while a compute
kernel ran too (hidden), and the busiest streams. It answers "is tensor
parallelism slow because the collectives are slow, because they are not
overlapped, or because the GPU waits on the host?".

Usage: busy.py [--warmup N] TRACE.tsv
"""
import argparse
import collections
import statistics

from kernel_table import MARKERS, read_trace_rows

COMM = ("nccl", "exchange_", "peer_copy")


def is_comm(name):
    lowered = name.lower()
    return any(word in lowered for word in COMM)


def union_ns(intervals):
    """Total length of the union of (start, end) intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def intersect_ns(a, b):
    """Length of the union of A intersected with the union of B."""
    return union_ns(a) + union_ns(b) - union_ns(a + b)


def steps_of(rows, warmup):
    steps, current = [], None
    for row in rows:
        if any(marker in row["name"].lower() for marker in MARKERS):
            if current:
                steps.append(current)
            current = []
        if current is not None:
            current.append(row)
    return steps[warmup:]


def summarise(step):
    span = max(r["end"] for r in step) - min(r["start"] for r in step)
    comm = [(r["start"], r["end"]) for r in step if is_comm(r["name"])]
    compute = [(r["start"], r["end"]) for r in step
               if not is_comm(r["name"])]
    busy = union_ns(comm + compute)
    by_stream = collections.Counter()
    for r in step:
        by_stream[r["stream"]] += r["end"] - r["start"]
    return {
        "span": span, "busy": busy, "idle": span - busy,
        "compute": union_ns(compute), "comm": union_ns(comm),
        "hidden": intersect_ns(comm, compute), "streams": by_stream,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("trace")
    args = parser.parse_args()
    rows = read_trace_rows(args.trace)
    devices = sorted({r["device"] for r in rows})
    print("| GPU | steps | step span (ms) | busy (ms) | idle (ms) | compute "
          "(ms) | comm (ms) | comm hidden under compute (ms) | streams "
          "(id: ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for device in devices:
        mine = sorted((r for r in rows if r["device"] == device),
                      key=lambda r: r["start"])
        steps = [summarise(s) for s in steps_of(mine, args.warmup)]
        if not steps:
            print(f"| {device} | 0 | - | - | - | - | - | - | - |")
            continue

        def mean_ms(key):
            return statistics.mean(s[key] for s in steps) / 1e6

        streams = collections.Counter()
        for s in steps:
            streams.update(s["streams"])
        top = ", ".join(f"{sid}: {ns / len(steps) / 1e6:.1f}"
                        for sid, ns in streams.most_common(4))
        print(f"| {device} | {len(steps)} | {mean_ms('span'):.1f} | "
              f"{mean_ms('busy'):.1f} | {mean_ms('idle'):.1f} | "
              f"{mean_ms('compute'):.1f} | {mean_ms('comm'):.1f} | "
              f"{mean_ms('hidden'):.1f} | {top} |")


if __name__ == "__main__":
    main()
