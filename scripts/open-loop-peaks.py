#!/usr/bin/env python3
"""kvroute's open-loop peak goodput against the baselines', over the union of several rate
grids, from `kvroute bench --rate-sweep ... --json DIR/s<seed>.json` outputs.

    scripts/open-loop-peaks.py --workload burst \\
        --kvroute bench/results/saturated-holder/open-loop,bench/results/saturated-holder/burst-high \\
        --baselines bench/results/open-loop,bench/results/saturated-holder/burst-high
    scripts/open-loop-peaks.py --workload hot-prefix \\
        --before bench/results/saturated-holder/open-loop-fine-before \\
        --kvroute bench/results/saturated-holder/open-loop-fine

A run's peak is its highest throughput (req/min) among the rates whose TTFT p90 meets the SLO
(`--slo`, 8 s), taken over every rate of every directory given for it: a grid whose top rate
still meets the SLO sets no peak, only a floor, so a second run of higher rates extends it.
Seeds are matched by file name (s<seed>.json) across directories.

- `--kvroute DIRS`: kvroute's runs (comma-separated directories).
- `--baselines DIRS`: the other policies' runs; per seed, the best baseline's peak and the
  ratio kvroute / best.
- `--before DIRS`: kvroute's runs on an earlier build: per seed the peak before and after,
  and the TTFT p90 at each rate both share.
"""

import argparse
import glob
import json
import os
import statistics


def points(dirs, seed, workload, policy):
    """Every rate point of `policy` on `workload` for `seed` over `dirs`."""
    out = []
    for d in dirs:
        path = os.path.join(d, f's{seed}.json')
        if not os.path.exists(path):
            continue
        with open(path) as f:
            w = json.load(f)['workloads'].get(workload, {})
        out.extend(w.get(policy, {}).get('rate_sweep', []))
    return out


def peak(pts, slo):
    ok = [p['throughput_rpm'] for p in pts if p['ttft_p90_s'] <= slo]
    return max(ok) if ok else 0.0


def policies(dirs, seed, workload):
    names = set()
    for d in dirs:
        path = os.path.join(d, f's{seed}.json')
        if os.path.exists(path):
            with open(path) as f:
                names.update(json.load(f)['workloads'].get(workload, {}).keys())
    return sorted(n for n in names if n != 'kvroute')


def spread(xs):
    return f'{statistics.median(xs):.2f}x [{min(xs):.2f}-{max(xs):.2f}]'


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--workload', required=True)
    ap.add_argument('--kvroute', required=True)
    ap.add_argument('--baselines')
    ap.add_argument('--before')
    ap.add_argument('--slo', type=float, default=8.0)
    a = ap.parse_args()
    kv_dirs = a.kvroute.split(',')
    seeds = sorted({os.path.basename(p)[1:-5] for d in kv_dirs for p in glob.glob(os.path.join(d, 's*.json'))})
    if a.baselines:
        base_dirs = a.baselines.split(',')
        print(f'{a.workload}: kvroute against the best baseline, peak goodput at p90 <= {a.slo:g} s')
        print()
        print('| seed | kvroute peak | rates | best baseline | its peak | ratio |')
        print('|---|---:|---|---|---:|---:|')
        ratios = []
        for s in seeds:
            kv_pts = points(kv_dirs, s, a.workload, 'kvroute')
            kv = peak(kv_pts, a.slo)
            best, best_peak = '-', 0.0
            for pol in policies(base_dirs, s, a.workload):
                p = peak(points(base_dirs, s, a.workload, pol), a.slo)
                if p > best_peak:
                    best, best_peak = pol, p
            rates = sorted({p['rate_per_s'] for p in kv_pts})
            ratio = kv / best_peak if best_peak > 0 else float('nan')
            ratios.append(ratio)
            print(f'| {s} | {kv:.1f} | {rates[0]:g}-{rates[-1]:g} | {best} | {best_peak:.1f} | {ratio:.2f}x |')
        print()
        print(f'median ratio {spread(ratios)}')
    if a.before:
        before_dirs = a.before.split(',')
        print()
        print(f'{a.workload}: kvroute before -> after, peak goodput at p90 <= {a.slo:g} s, and TTFT p90 (s) per rate')
        print()
        print('| seed | peak before | peak after | p90 per rate, before -> after |')
        print('|---|---:|---:|---|')
        before_peaks, after_peaks = [], []
        for s in seeds:
            b_pts = points(before_dirs, s, a.workload, 'kvroute')
            k_pts = points(kv_dirs, s, a.workload, 'kvroute')
            b, k = peak(b_pts, a.slo), peak(k_pts, a.slo)
            before_peaks.append(b)
            after_peaks.append(k)
            by_rate = {}
            for p in b_pts:
                by_rate.setdefault(p['rate_per_s'], p['ttft_p90_s'])
            after = {}
            for p in k_pts:
                after.setdefault(p['rate_per_s'], p['ttft_p90_s'])
            cells = ', '.join(
                f'{r:g}: {by_rate[r]:.1f} -> {after[r]:.1f}' for r in sorted(after) if r in by_rate
            )
            print(f'| {s} | {b:.1f} | {k:.1f} | {cells} |')
        print()
        print(
            f'peak median {statistics.median(before_peaks):.1f} -> {statistics.median(after_peaks):.1f}, '
            f'sum {sum(before_peaks):.1f} -> {sum(after_peaks):.1f}'
        )


if __name__ == '__main__':
    main()
