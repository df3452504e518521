#!/usr/bin/env python3
"""The tables of bench/parallel/run.sh and of the one-GPU emulation
(tests/executor/gpu/run_devcomm.sh): throughput of each parallel plan
against its one-GPU baseline, and each run's step against `partita
estimate` of its plan, from the run.json (and estimate) files.

  table.py WARMUP RUN_DIR ROW...
ROW is NAME:BASELINE:TARGET[:GPUS]: BASELINE the name of the baseline row
("-" for a baseline itself), TARGET the ratio the row should reach ("-"
for none), GPUS how many baselines the row is held against (2 on two
GPUs, where each GPU does the baseline's work; 1 on one GPU split into
slices, default 2). ratio = tokens/s / (GPUS x the baseline's tokens/s).
Each row's throughput is tokens per iteration over the median step time of
the iterations after the first WARMUP (cuBLAS, NCCL connections and first
touches of memory are paid in those). When RUN_DIR/NAME.estimate.json
(`partita estimate PLAN --json`) exists, its step time is shown and the
measured step must lie within 10 % of it, and a second table holds rank
0's forward, backward and optimizer times (the median over the events of
the iteration run.json kept) against the estimate's for its stage: on
slices of one GPU, against the profile its cluster names (run_devcomm.sh:
a slice beside its busy neighbours for plans of several slices, a slice
alone for one rank), so this shows what the profile leaves out. Exit
status 1 when a run is missing.
"""
import json
import os
import statistics
import sys

ESTIMATE_TOLERANCE = 0.10


def throughput(path, warmup):
    with open(path) as f:
        run = json.load(f)
    times = [it["step_time_s"] for it in run["iterations"]][warmup:]
    if not times:
        raise ValueError(f"{path}: no iteration after the {warmup} warm-up")
    step = statistics.median(times)
    tokens = run["training"]["tokens_per_iteration"]
    return tokens / step, step, len(times), run


def load_estimate(directory, name):
    path = os.path.join(directory, name + ".estimate.json")
    try:
        with open(path) as f:
            return json.load(f)["estimate"]
    except (OSError, ValueError, KeyError):
        return None


def estimated_step(directory, name):
    estimate = load_estimate(directory, name)
    return estimate["step_time_s"] if estimate else None


def rank0_phase(run, kind):
    """Median duration of rank 0's events of a kind, or None."""
    spans = [e["end_s"] - e["start_s"] for e in run.get("events", [])
             if e.get("rank", 0) == 0 and e.get("kind") == kind]
    return statistics.median(spans) if spans else None


def phase_cell(measured, estimated):
    if measured is None or not estimated:
        return "-"
    return (f"{measured * 1e3:.2f} / {estimated * 1e3:.2f} "
            f"({measured / estimated:.3f})")


def compute_table(directory, runs):
    """Rank 0's phases against the estimate of its stage."""
    print()
    print("| plan | fwd per micro-batch: measured / estimated (ms) "
          "| bwd per micro-batch | optimizer |")
    print("|---|---|---|---|")
    for name, run in runs:
        estimate = load_estimate(directory, name)
        if estimate is None or not estimate.get("stages"):
            continue
        stage = estimate["stages"][0]
        print(f"| {name} | "
              f"{phase_cell(rank0_phase(run, 'fwd'), stage['forward_s'])} | "
              f"{phase_cell(rank0_phase(run, 'bwd'), stage['backward_s'])} | "
              f"{phase_cell(rank0_phase(run, 'optimizer'), stage['optimizer_s'])} |")


def estimate_cells(step, estimate):
    if estimate is None:
        return "-", "-"
    error = step / estimate - 1.0
    verdict = "yes" if abs(error) <= ESTIMATE_TOLERANCE else "NO"
    return f"{estimate * 1e3:.1f}", f"{error:+.1%} ({verdict})"


def main(argv):
    if len(argv) < 4:
        print(__doc__)
        return 2
    warmup, directory, rows = int(argv[1]), argv[2], argv[3:]
    results, missing, timed_counts, runs = {}, False, set(), []
    print("| plan | model | tp dp pp | gbs mbs | step (ms) | estimate (ms) "
          "| step vs estimate (within 10 %) | tokens/s | ratio | target "
          "| peak GiB per rank |")
    print("|---|---|---|---|---:|---:|---|---:|---:|---|---|")
    for row in rows:
        fields = row.split(":")
        name, baseline, target = fields[:3]
        gpus = int(fields[3]) if len(fields) > 3 else 2
        path = os.path.join(directory, name + ".run.json")
        try:
            tps, step, timed, run = throughput(path, warmup)
            timed_counts.add(timed)
        except (OSError, ValueError, KeyError) as problem:
            print(f"| {name} | failed: {problem} | | | | | | | | | |")
            missing = True
            continue
        results[name] = tps
        runs.append((name, run))
        plan = run["plan"]
        ratio, verdict = "-", "-"
        if baseline != "-" and baseline in results:
            value = tps / (gpus * results[baseline])
            ratio = f"{value:.3f}"
            if target != "-":
                verdict = (f">= {target}: "
                           + ("met" if value >= float(target) else "MISSED"))
        estimate, versus = estimate_cells(step,
                                          estimated_step(directory, name))
        memory = ", ".join(f"{m:.1f}" for m in run["peak_memory_gib"])
        print(f"| {name} | {plan['model']['name']} | {plan['tp']} "
              f"{plan['dp']} {plan['pp']} | {plan['gbs']} {plan['mbs']} | "
              f"{step * 1e3:.1f} | {estimate} | {versus} | {tps:.0f} | "
              f"{ratio} | {verdict} | {memory} |")
    counts = sorted(timed_counts)
    timed = (f"{counts[0]}" if len(counts) == 1 else
             f"{counts[0]} to {counts[-1]}" if counts else "no")
    print(f"(median of {timed} iterations after {warmup} warm-up, by row; "
          f"ratio = tokens/s / (GPUs x the baseline row's tokens/s))")
    compute_table(directory, runs)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
