#!/usr/bin/env python3
"""Checks of tests/executor/gpu/run_parallel.sh on the run.json files of
`partita exec` (formats.md, "Run"). Each check prints PASS or FAIL lines
with the numbers it compared and exits 1 when one failed.

  losses ONE.json OTHER.json NAME FIRST_TOL ALL_TOL
      the parallel run OTHER against the one-GPU run ONE of the same model,
      data and seed: iteration 1's loss within FIRST_TOL (relative), every
      iteration's within ALL_TOL
  resume STRAIGHT.json RESUMED.json TOL
      a run resumed from a checkpoint against the straight run: every
      iteration the resumed run made has the straight run's loss within TOL
  hetero FULL.json THROTTLED.json MIN_RATIO SM_LIMIT MEMORY_GIB
      the same pp = 2 plan with GPU 1 whole and GPU 1 in a green context:
      stage 1's mean forward and backward times grow by at least MIN_RATIO,
      and run.json reports the throttled device's SMs and memory cap
"""
import json
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def losses(run):
    return [it["loss"] for it in run["iterations"]]


def report(ok, text):
    print(("PASS " if ok else "FAIL ") + text)
    return ok


def check_losses(one_path, other_path, name, first_tol, all_tol):
    one, other = losses(load(one_path)), losses(load(other_path))
    if len(one) != len(other) or not one:
        return report(False, f"{name}: {len(other)} iterations against "
                             f"{len(one)}")
    relative = [abs(a - b) / abs(a) for a, b in zip(one, other)]
    worst = max(range(len(relative)), key=relative.__getitem__)
    ok = report(relative[0] <= first_tol,
                f"{name}: iteration 1 loss {other[0]:.6f} vs one GPU "
                f"{one[0]:.6f}, relative difference {relative[0]:.2e} "
                f"(tolerance {first_tol:.0e})")
    ok &= report(relative[worst] <= all_tol,
                 f"{name}: {len(one)} iterations, largest relative loss "
                 f"difference {relative[worst]:.2e} at iteration "
                 f"{worst + 1} ({other[worst]:.6f} vs {one[worst]:.6f}; "
                 f"tolerance {all_tol:.0e}); final loss {other[-1]:.4f} vs "
                 f"{one[-1]:.4f}")
    return ok


def check_resume(straight_path, resumed_path, tol):
    straight, resumed = load(straight_path), load(resumed_path)
    by_iteration = {it["iteration"]: it["loss"]
                    for it in straight["iterations"]}
    rows = [(it["iteration"], it["loss"]) for it in resumed["iterations"]]
    if not rows:
        return report(False, "resume: the resumed run made no iteration")
    worst = max(abs(loss - by_iteration[i]) / abs(by_iteration[i])
                for i, loss in rows)
    return report(worst <= tol,
                  f"resume: iterations {rows[0][0]}-{rows[-1][0]} of the "
                  f"resumed pp = 2 run match the straight run, largest "
                  f"relative loss difference {worst:.2e} (tolerance "
                  f"{tol:.0e})")


def stage_means(run, stage, kind):
    times = [e["end_s"] - e["start_s"] for e in run["events"]
             if e["stage"] == stage and e["kind"] == kind]
    return statistics.mean(times) if times else float("nan")


def check_hetero(full_path, throttled_path, min_ratio, sm_limit, memory_gib):
    full, throttled = load(full_path), load(throttled_path)
    ok = True
    for kind in ("fwd", "bwd"):
        a, b = stage_means(full, 1, kind), stage_means(throttled, 1, kind)
        s0 = stage_means(throttled, 0, kind)
        ratio = b / a
        ok &= report(ratio >= min_ratio,
                     f"hetero: stage 1 mean {kind} {b * 1e3:.2f} ms on "
                     f"{sm_limit} SMs vs {a * 1e3:.2f} ms on the whole GPU "
                     f"(x{ratio:.2f}, at least x{min_ratio}); stage 0 on "
                     f"the whole GPU 0 {s0 * 1e3:.2f} ms")
    device = throttled["devices"][1]
    sms = device.get("sms_used") or 0
    ok &= report(sm_limit <= sms <= sm_limit + 8,
                 f"hetero: run.json says rank 1 used {sms} SMs "
                 f"(sm_limit {sm_limit})")
    cap = device.get("memory_cap_gib") or 0
    ok &= report(abs(cap - memory_gib) < 1e-6,
                 f"hetero: run.json says rank 1's memory cap is {cap} GiB "
                 f"(memory_limit_gib {memory_gib})")
    print(f"NOTE hetero: step time {throttled['step_time_s'] * 1e3:.1f} ms "
          f"throttled vs {full['step_time_s'] * 1e3:.1f} ms whole; peak "
          f"memory per rank {throttled['peak_memory_gib']} GiB")
    return ok


def main(argv):
    what = argv[1] if len(argv) > 1 else ""
    if what == "losses" and len(argv) == 7:
        ok = check_losses(argv[2], argv[3], argv[4], float(argv[5]),
                          float(argv[6]))
    elif what == "resume" and len(argv) == 5:
        ok = check_resume(argv[2], argv[3], float(argv[4]))
    elif what == "hetero" and len(argv) == 7:
        ok = check_hetero(argv[2], argv[3], float(argv[4]), int(argv[5]),
                          float(argv[6]))
    else:
        print(__doc__)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
