#!/usr/bin/env python3
"""Open-loop (--rate-sweep) and closed-loop peak goodput per policy over several seeds'
`kvroute bench --json` files, and kvroute's ratio to the best baseline per seed
(greedy-clairvoyant is no baseline). bench/README.md, "Open loop".

    scripts/open-loop-summary.py bench/results/open-loop > bench/results/open-loop/summary.md

With a second directory of kvroute-only re-runs (`--policies kvroute`, the same seeds and
flags, files of the same names), kvroute's rows come from it and the baselines' from the
first (the baselines do not change with kvroute's rules):

    scripts/open-loop-summary.py bench/results/open-loop bench/results/kv-overlap/open-loop
"""
import os
import glob
import json
import statistics as st
import sys

files = sorted(glob.glob(sys.argv[1] + '/s*.json')) if len(sys.argv) > 1 else sys.exit(__doc__)
runs=[json.load(open(f)) for f in files]
if len(sys.argv) > 2:
    for f, r in zip(files, runs):
        k = json.load(open(os.path.join(sys.argv[2], os.path.basename(f))))
        assert k['config']['seed'] == r['config']['seed'], f
        for wl, pols in k['workloads'].items():
            r['workloads'][wl]['kvroute'] = pols['kvroute']
print(f"{len(runs)} seeds:", ', '.join(str(r['config']['seed']) for r in runs))
for wl in ['hot-prefix','burst']:
    print(f"\n{wl}\n")
    pols=list(runs[0]['workloads'][wl].keys())
    print("| policy | peak goodput, open loop (median [min-max]) | peak goodput, closed loop |")
    print("|---|---:|---:|")
    f=lambda xs: f"{st.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]"
    for p in pols:
        o=[r['workloads'][wl][p]['peak_goodput_open_rpm'] for r in runs]
        c=[r['workloads'][wl][p]['peak_goodput_rpm'] for r in runs]
        print(f"| {p} | {f(o)} | {f(c)} |")
    print()
    print("| seed | kvroute open | best baseline open | ratio | kvroute closed | best baseline closed | ratio |")
    print("|---|---:|---|---:|---:|---|---:|")
    ro=[];rc=[]
    for r in runs:
        W=r['workloads'][wl]
        base={p:v for p,v in W.items() if p not in ('kvroute','greedy-clairvoyant')}
        bo=max(base,key=lambda p:base[p]['peak_goodput_open_rpm']); bc=max(base,key=lambda p:base[p]['peak_goodput_rpm'])
        k=W['kvroute']
        a=k['peak_goodput_open_rpm']/base[bo]['peak_goodput_open_rpm']; b=k['peak_goodput_rpm']/base[bc]['peak_goodput_rpm']
        ro.append(a); rc.append(b)
        print(f"| {r['config']['seed']} | {k['peak_goodput_open_rpm']:.1f} | {bo} {base[bo]['peak_goodput_open_rpm']:.1f} | {a:.2f}x | {k['peak_goodput_rpm']:.1f} | {bc} {base[bc]['peak_goodput_rpm']:.1f} | {b:.2f}x |")
    print(f"\nmedian ratio open {st.median(ro):.2f}x [{min(ro):.2f}-{max(ro):.2f}], closed {st.median(rc):.2f}x [{min(rc):.2f}-{max(rc):.2f}]")
