#!/usr/bin/env python3
"""Where a training step's GPU time goes, kernel by kernel: reads the CSV
of `ncu --csv --metrics gpu__time_duration.sum PROGRAM` (Nsight Compute,
one row per kernel launch) and prints the total time of each kernel name
divided by the number of profiled steps, largest first.

Usage: kernel_profile.py NCU.csv [STEPS]
"""
import collections
import csv
import re
import sys


def short_name(name):
    """Kernel names without template arguments and parameter lists."""
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"<.*", "", name)
    return name.replace("void ", "")[:70]


def main():
    path = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    totals = collections.defaultdict(float)
    counts = collections.Counter()
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3,
                 "ms": 1.0, "msecond": 1.0}.get(unit, 1e-6)
        name = short_name(row["Kernel Name"])
        totals[name] += value * scale
        counts[name] += 1
    grand = sum(totals.values())
    print(f"{'kernel':70s} {'ms/step':>9s} {'calls':>6s} {'share':>6s}")
    for name, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{name:70s} {ms / steps:9.3f} {counts[name] // steps:6d} "
              f"{100 * ms / grand:5.1f}%")
    print(f"{'total':70s} {grand / steps:9.3f}")


if __name__ == "__main__":
    main()
