#!/usr/bin/env python3
"""Summary tables of scripts/sim-compare.sh output: kvroute's figures per flag value.

    scripts/sim-compare-summary.py OUT/<value> OUT/<value> [...]

Each cell reads "first -> second -> ..." in the order the directories are given.
"""
import functools
import json
import os
import statistics
import sys

DEFAULT_SEEDS = [42, 7001, 9123, 469230029, 1661861031, 498677416, 1121021027, 1203141611,
                 1577297384, 1160472425, 1586353599, 1769201752, 809476403, 2051192300]
LIVE_MT = [210357577, 483481523, 872446507]
LIVE_DIS = [642781104, 1020218965, 499400433]


@functools.lru_cache(maxsize=None)
def load(d, name):
    with open(os.path.join(d, name + ".json")) as f:
        return json.load(f)


def kv(d, name, workload):
    return load(d, name)["workloads"][workload]["kvroute"]


def figures(k):
    p = k.get("prediction") or {}
    return {
        "p50": k["ttft_p50_s"],
        "p90": k["ttft_p90_s"],
        "goodput": k["peak_goodput_rpm"],
        "hit": k["cache_hit_rate"],
        "error": p.get("median_rel_error", float("nan")),
        "coverage": p.get("published_bound_coverage", float("nan")),
    }


FMT = {"p50": "{:.3f}", "p90": "{:.3f}", "goodput": "{:.1f}", "hit": "{:.1%}",
       "error": "{:.1%}", "coverage": "{:.1%}"}


def cell(values, key):
    return " -> ".join(FMT[key].format(v) for v in values)


def default_suite(dirs):
    for w, keys in [("multi-turn", ["p90", "goodput", "error", "coverage", "hit"]),
                    ("shared-prefix", ["p50", "p90", "goodput", "error", "coverage"]),
                    ("independent", ["p90", "goodput", "error"]),
                    ("mixed", ["p90", "goodput", "error", "coverage"])]:
        print(f"\n#### {w} (default suite, 4 runs pooled per set, 32 clients)\n")
        print("| seeds | " + " | ".join(keys) + " |")
        print("|---|" + "---|" * len(keys))
        per = {k: [[] for _ in dirs] for k in keys}
        for s in DEFAULT_SEEDS:
            rows = [figures(kv(d, f"{w}-{s}", w)) for d in dirs]
            for k in keys:
                for i, r in enumerate(rows):
                    per[k][i].append(r[k])
            print(f"| {s}-{s + 3} | " + " | ".join(cell([r[k] for r in rows], k) for k in keys) + " |")
        print("| median [min-max] | " + " | ".join(
            " -> ".join(f"{FMT[k].format(statistics.median(v))} [{FMT[k].format(min(v))}-"
                        f"{FMT[k].format(max(v))}]" for v in per[k]) for k in keys) + " |")


def scenario(dirs, name):
    print(f"\n#### {name} (per seed)\n")
    print("| workload | goodput | TTFT p90 (s) | median error / published-bound coverage |")
    print("|---|---|---|---|")
    runs = [load(d, name) for d in dirs]
    for w in runs[0]["seeds"]:
        gp = [" / ".join(f"{x:.1f}" for x in r["seeds"][w]["kvroute"]["peak_goodput_rpm"]["per_seed"])
              for r in runs]
        p90 = [" / ".join(f"{x:.2f}" for x in r["seeds"][w]["kvroute"]["ttft_p90_s"]["per_seed"])
               for r in runs]
        pred = []
        for r in runs:
            cells = []
            for s in r["prediction"]:
                for q in s["kvroute"]:
                    if q["workload"] == w:
                        cells.append(f"{q['median_rel_error']:.1%}/{q['published_bound_coverage']:.1%}")
            pred.append(" ".join(cells))
        print(f"| {w} | " + " -> ".join(gp) + " | " + " -> ".join(p90) + " | " + " -> ".join(pred) + " |")


def shapes(dirs):
    print("\n#### other shapes\n")
    print("| run | workload | TTFT p50 (s) | TTFT p90 (s) | goodput | hit | error | coverage |")
    print("|---|---|---|---|---|---|---|---|")
    names = ["disagree", "long-short", "long-short-kv"]
    names += [f"live-multi-turn-{s}" for s in LIVE_MT] + [f"live-hot-prefix-{s}" for s in LIVE_DIS]
    for name in names:
        for w in load(dirs[0], name)["workloads"]:
            rows = [figures(kv(d, name, w)) for d in dirs]
            print(f"| {name} | {w} | " + " | ".join(
                cell([r[k] for r in rows], k)
                for k in ["p50", "p90", "goodput", "hit", "error", "coverage"]) + " |")
    print("\n| run | workload | throughput per concurrency (req/min) | requests per worker |")
    print("|---|---|---|---|")
    for name in names[3:]:
        for w in load(dirs[0], name)["workloads"]:
            ks = [kv(d, name, w) for d in dirs]
            thr = [" / ".join(f"c{x['concurrency']} {x['throughput_rpm']:.1f}" for x in k["sweep"]) for k in ks]
            split = ["/".join(str(n) for n in k["requests_per_worker"]) for k in ks]
            print(f"| {name} | {w} | " + " -> ".join(thr) + " | " + " -> ".join(split) + " |")


def main():
    dirs = sys.argv[1:]
    if not dirs:
        sys.exit(__doc__)
    print("directories: " + " -> ".join(dirs))
    default_suite(dirs)
    scenario(dirs, "kinference")
    scenario(dirs, "kinference-hetero")
    shapes(dirs)


if __name__ == "__main__":
    main()
