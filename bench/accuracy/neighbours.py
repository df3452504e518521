#!/usr/bin/env python3
"""Do neighbours that rest explain the sliced pipelines' errors? For the
one-GPU suite's pipelines of slices (plans 14, 17, 19), per stage: the
share of its neighbours' SMs busy (their fwd/bwd events, SM-weighted)
during the stage's own fwd/bwd, the measured per-micro-batch forward and
backward over the estimate's (the slice profiled beside busy
neighbours), the share the alone-to-beside interpolation
alone x (1 + (R - 1) x share) would need to match, and what it predicts
with the measured share. R = beside / alone is the layer's at mbs 1 from
docs/profiles.md's table (both measured in the same call by the same
build; the committed alone profiles predate cuDNN's attention).

usage: neighbours.py RUNS_DIR PARTITA   (docs/profiles.md, "Slices beside
busy neighbours", holds its output)"""
import json
import subprocess
import sys

# plan: (SMs of each stage's slice, (R forward, R backward) per stage or
# None where the table has no figure: the 8-SM ends hold no layers)
PLANS = {
    '14-4x16-xl-pp4': ([16] * 4, [(1.44, 1.39)] * 4),
    '19-hetero4-xl-pp4': ([40, 40, 16, 16],
                          [(1.19, 1.22)] * 2 + [(1.20, 1.20)] * 2),
    '17-pp8-xl-ends': ([8] + [16] * 6 + [8],
                       [None] + [(1.35, 1.34)] * 6 + [None]),
}


def busy_share(events, stage, sms):
    """SM-weighted share of the other slices computing during stage's
    own fwd/bwd events."""
    own = [e for e in events if e['stage'] == stage]
    others = [e for e in events if e['stage'] != stage]
    neighbour_sms = sum(sms) - sms[stage]
    busy = total = 0.0
    for e in own:
        total += e['end_s'] - e['start_s']
        for o in others:
            overlap = min(o['end_s'], e['end_s']) - max(o['start_s'],
                                                        e['start_s'])
            if overlap > 0:
                busy += overlap * sms[o['stage']] / neighbour_sms
    return busy / total


def mean_duration(events, stage, kind):
    times = [e['end_s'] - e['start_s'] for e in events
             if e['stage'] == stage and e['kind'] == kind]
    return sum(times) / len(times)


def main():
    runs, partita = sys.argv[1], sys.argv[2]
    for name, (sms, ratios) in PLANS.items():
        with open(f'{runs}/{name}.run.json') as f:
            run = json.load(f)
        estimated = json.loads(subprocess.run(
            [partita, 'estimate', f'bench/accuracy/plans-1gpu/{name}.json',
             '--json'], capture_output=True, text=True,
            check=True).stdout)['estimate']['stages']
        events = [e for e in run['events'] if e['kind'] in ('fwd', 'bwd')]
        print(f'{name}')
        print('| stage | SMs | neighbours busy | fwd meas/est | bwd meas/est '
              '| share needed fwd / bwd | interpolation predicts fwd / bwd |')
        print('|---:|---:|---:|---:|---:|---|---|')
        for stage in range(len(sms)):
            share = busy_share(events, stage, sms)
            fwd = mean_duration(events, stage, 'fwd') / \
                estimated[stage]['forward_s']
            bwd = mean_duration(events, stage, 'bwd') / \
                estimated[stage]['backward_s']
            needed = predicted = '-'
            if ratios[stage]:
                rf, rb = ratios[stage]
                needed = (f'{(rf * fwd - 1) / (rf - 1):.2f} / '
                          f'{(rb * bwd - 1) / (rb - 1):.2f}')
                predicted = (f'{(1 + (rf - 1) * share) / rf:.3f} / '
                             f'{(1 + (rb - 1) * share) / rb:.3f}')
            print(f'| {stage} | {sms[stage]} | {share:.2f} | {fwd:.3f} | '
                  f'{bwd:.3f} | {needed} | {predicted} |')


if __name__ == '__main__':
    main()
