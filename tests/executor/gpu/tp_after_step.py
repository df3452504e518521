"""The verdicts of tp_after_step.sh: per model and seed, every cuda row's
iteration-2 loss against the cpu backend's from the same checkpoint
(relative), and the two cpu runs' distance (tp 1's and tp 2's fp32
steps), which is reported, not judged. One line a row:
VERDICT NAME TEXT (PASS, FAIL or NOTE).

Usage: tp_after_step.py LOG_DIR "SEED..." MODEL...
"""
import json
import os
import sys

# From the same parameters every path came within 5.8e-4 of the fp32
# forward on three seeds of both models, the order of the paths
# changing from seed to seed (thirty-second session): the
# bf16 forward's own spread after a step. The limit that sets: an error
# that moves the loss by less than about 1e-3 goes unseen (putting the
# norms' parameters and the row-parallel biases of a two-layer model
# back to their first values moved its iteration 2 by 7.5e-4, thirty-first
# session, item 6); a dropped or doubled parameter class of a layer
# moves it by a share of the step's own 5-10 %.
TOLERANCE = 1e-3
ROWS = (("tp1", 1), ("tp1-epilogue", 1), ("tp2-inline", 2), ("tp2-o1", 2),
        ("tp2-o3", 2), ("tp2-host", 2), ("tp2-fuse0", 2))


def loss_at(path, iteration):
    """The loss of one iteration in a run.json, or None."""
    try:
        with open(path) as f:
            run = json.load(f)
    except (OSError, ValueError):
        return None
    for entry in run.get("iterations", []):
        if entry.get("iteration") == iteration:
            return entry.get("loss")
    return None


def verdicts(logs, seeds, models):
    for model in models:
        for seed in seeds:
            at = "%s-s%s" % (model, seed)
            cpu = {tp: loss_at(os.path.join(logs, "%s-cpu%d.run.json" % (at, tp)), 2)
                   for tp in (1, 2)}
            if cpu[1] is not None and cpu[2] is not None:
                yield ("NOTE", at + "-cpu", "iteration 2: tp 1 %.6f, tp 2 %.6f "
                       "(%.1e relative)" % (cpu[1], cpu[2],
                                            abs(cpu[2] - cpu[1]) / abs(cpu[1])))
            for row, tp in ROWS:
                name = "%s-%s" % (at, row)
                got = loss_at(os.path.join(logs, name + ".run.json"), 2)
                if cpu[tp] is None or got is None:
                    yield ("FAIL", name + "-forward",
                           "no iteration-2 loss (this row's or the cpu's)")
                    continue
                d = abs(got - cpu[tp]) / abs(cpu[tp])
                yield ("PASS" if d <= TOLERANCE else "FAIL", name + "-forward",
                       "iteration 2: %.6f against the cpu's %.6f (%.1e "
                       "relative, at most %.0e)" % (got, cpu[tp], d, TOLERANCE))


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    for v, name, text in verdicts(sys.argv[1], sys.argv[2].split(), sys.argv[3:]):
        print(v, name, text)
