#!/usr/bin/env python3
"""Buoyant's claimed ratios over random, per policy, from a `kvroute bench --scenario
kinference` JSON: per seed, then median [min-max] over the seeds.

    scripts/kinference-ratios.py bench/results/kinference.json

Prints a markdown table: shared-prefix random / policy median TTFT, policy / random peak
goodput, multi-turn random / policy median TTFT (Kinference's published figures over
Buoyant's random: 22x, 7.4x, 2.9x).
"""
import json
import statistics
import sys

RATIOS = [
    ("shared-prefix", "ttft_p50_s", True),
    ("shared-prefix", "peak_goodput_rpm", False),
    ("multi-turn", "ttft_p50_s", True),
]


def per_seed(seeds, workload, policy, figure):
    try:
        return seeds[workload][policy][figure]["per_seed"]
    except KeyError:
        return None


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: kinference-ratios.py KINFERENCE_JSON")
    with open(sys.argv[1]) as f:
        seeds = json.load(f)["seeds"]
    policies = [p for p in seeds["shared-prefix"] if p != "random"]
    print("| policy | shared-prefix: random / policy median TTFT "
          "| shared-prefix: policy / random peak goodput "
          "| multi-turn: random / policy median TTFT |")
    print("|---|---|---|---|")
    for p in policies:
        cells = []
        for workload, figure, random_over in RATIOS:
            r = per_seed(seeds, workload, "random", figure)
            x = per_seed(seeds, workload, p, figure)
            if not r or not x or len(r) != len(x):
                cells.append("-")
                continue
            pairs = zip(r, x) if random_over else zip(x, r)
            vals = [a / b for a, b in pairs if b > 0]
            if not vals:
                cells.append("-")
                continue
            cells.append(f"{statistics.median(vals):.1f}x [{min(vals):.1f}-{max(vals):.1f}]")
        print(f"| {p} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
