"""The verdicts of tp_after_step.sh: for each model, every tp 2 row's
losses at iterations 2 and 3 against the tp 1 row's (relative), and the
cpu row's distance where there is one. One line a row:
VERDICT NAME TEXT (PASS, FAIL or NOTE; NOTE is reported, not judged).

Usage: tp_after_step.py LOG_DIR MODEL...
"""
import json
import os
import sys

TOLERANCE = 1.5e-4  # =3 and tp 1 agreed to 2e-5, in line was 3e-4 off
VARIANTS = ("inline", "o1", "o3", "host", "fuse0")


def losses(path):
    """Iterations 2 and 3's losses of a run.json, or None."""
    try:
        with open(path) as f:
            run = json.load(f)
    except (OSError, ValueError):
        return None
    by_iteration = {i["iteration"]: i["loss"] for i in run["iterations"]}
    if 2 not in by_iteration or 3 not in by_iteration:
        return None
    return by_iteration[2], by_iteration[3]


def distance(got, want):
    return max(abs(g - w) / abs(w) for g, w in zip(got, want))


def verdicts(logs, models):
    for model in models:
        reference = losses(os.path.join(logs, model + "-tp1.run.json"))
        if reference is None:
            yield "FAIL", model + "-after-step", "no tp 1 run to compare with"
            continue
        rows = [(model + "-tp2-" + v, True) for v in VARIANTS]
        if os.path.exists(os.path.join(logs, model + "-cpu.run.json")):
            rows.append((model + "-cpu", False))
        for name, judged in rows:
            got = losses(os.path.join(logs, name + ".run.json"))
            if got is None:
                yield "FAIL", name + "-after-step", "no losses of iterations 2 and 3"
                continue
            d = distance(got, reference)
            text = ("iterations 2, 3: %.5f, %.5f against tp 1's %.5f, %.5f "
                    "(%.1e relative%s)" % (got + reference + (d, "" if not judged
                        else ", at most %.1e" % TOLERANCE)))
            verdict = ("PASS" if d <= TOLERANCE else "FAIL") if judged else "NOTE"
            yield verdict, name + "-after-step", text


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for v, name, text in verdicts(sys.argv[1], sys.argv[2:]):
        print(v, name, text)
