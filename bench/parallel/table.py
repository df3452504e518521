#!/usr/bin/env python3
"""The table of bench/parallel/run.sh: throughput of each 2-GPU plan
against twice the one-GPU run of the same model, from the run.json files
`partita exec` wrote.

  table.py WARMUP RUN_DIR ROW...
ROW is NAME:BASELINE:TARGET (BASELINE the name of the one-GPU row, "-" for
a baseline itself; TARGET the ratio the row should reach, "-" for none).
Each row's throughput is tokens per iteration over the median step time of
the iterations after the first WARMUP (cuBLAS, NCCL connections and first
touches of memory are paid in those). Exit status 1 when a run is missing.
"""
import json
import os
import statistics
import sys


def throughput(path, warmup):
    with open(path) as f:
        run = json.load(f)
    times = [it["step_time_s"] for it in run["iterations"]][warmup:]
    if not times:
        raise ValueError(f"{path}: no iteration after the {warmup} warm-up")
    step = statistics.median(times)
    tokens = run["training"]["tokens_per_iteration"]
    return tokens / step, step, len(times), run


def main(argv):
    if len(argv) < 4:
        print(__doc__)
        return 2
    warmup, directory, rows = int(argv[1]), argv[2], argv[3:]
    results, missing, timed = {}, False, 0
    print(f"| plan | model | tp dp pp | gbs mbs | step (ms) | tokens/s "
          f"| ratio to 2 x one GPU | target | peak GiB per rank |")
    print("|---|---|---|---|---:|---:|---:|---|---|")
    for row in rows:
        name, baseline, target = row.split(":")
        path = os.path.join(directory, name + ".run.json")
        try:
            tps, step, timed, run = throughput(path, warmup)
        except (OSError, ValueError, KeyError) as problem:
            print(f"| {name} | failed: {problem} | | | | | | | |")
            missing = True
            continue
        results[name] = tps
        plan = run["plan"]
        ratio, verdict = "-", "-"
        if baseline != "-" and baseline in results:
            value = tps / (2 * results[baseline])
            ratio = f"{value:.3f}"
            if target != "-":
                verdict = (f">= {target}: "
                           + ("met" if value >= float(target) else "MISSED"))
        memory = ", ".join(f"{m:.1f}" for m in run["peak_memory_gib"])
        print(f"| {name} | {plan['model']['name']} | {plan['tp']} "
              f"{plan['dp']} {plan['pp']} | {plan['gbs']} {plan['mbs']} | "
              f"{step * 1e3:.1f} | {tps:.0f} | {ratio} | {verdict} | "
              f"{memory} |")
    print(f"(median of {timed} iterations after {warmup} warm-up; "
          f"ratio = tokens/s / (2 x the one-GPU row's tokens/s))")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
