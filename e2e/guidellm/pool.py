#!/usr/bin/env python3
"""Pools GuideLLM 0.8.1 reports of several runs and concurrency levels into one table.

    e2e/guidellm/pool.py --speedup K [--json F] OUT/s<seed>-c<streams>/guidellm-<router>.json... > pooled.md

Each directory `s<seed>-c<streams>` is one `e2e/guidellm/run.sh` invocation (every router
over fresh mock workers, the same GuideLLM data seed). Per router and level: TTFT p50 / p90,
e2e p50 (simulated seconds: wall clock x K) and throughput (successful requests per
simulated minute), as the median over the runs with [min-max]; then per level whether kvroute
is at least as good as the best real peer router (names ending in `-cache-aware` that are not
kvroute) on the median of each figure. `--json F` also writes every report's figures (the
reports themselves are ~8 MB each). `--peers-from FIGURES.json` adds the figures of the
routers other than kvroute from an earlier pooled run's `--json` (only the seeds and levels
the reports given here cover), so that a new kvroute build can be re-run alone against the
peers' stored runs (`PEERS= POLICIES=kvroute` with the same `SEEDS`, `LEVELS`, `DATA`).
"""
import argparse
import json
import os
import re
import statistics

FIGURES = [  # key, label, lower is better
    ("ttft_p50", "TTFT p50 (s)", True),
    ("ttft_p90", "TTFT p90 (s)", True),
    ("e2e_p50", "e2e p50 (s)", True),
    ("rpm", "throughput (req/min)", False),
]


def figures(path, speedup):
    b = json.load(open(path))["benchmarks"][0]
    ttft = b["metrics"]["time_to_first_token_ms"]["successful"]
    lat = b["metrics"]["request_latency"]["successful"]
    done = len(b["requests"]["successful"])
    return {
        "ttft_p50": ttft["median"] * speedup / 1e3,
        "ttft_p90": ttft["percentiles"]["p90"] * speedup / 1e3,
        "e2e_p50": lat["median"] * speedup,
        "rpm": done / (b["duration"] * speedup) * 60.0,
        "requests": done,
    }


def fmt(xs, digits):
    return f"{statistics.median(xs):.{digits}f} [{min(xs):.{digits}f}-{max(xs):.{digits}f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--speedup", type=float, required=True)
    ap.add_argument("--json", help="write each report's figures here")
    ap.add_argument("--peers-from", help="an earlier --json: its routers other than kvroute")
    ap.add_argument("reports", nargs="+")
    a = ap.parse_args()
    cells, seeds, levels, routers, rows = {}, set(), set(), [], []

    def add(router, seed, level, f):
        seeds.add(seed)
        levels.add(level)
        if router not in routers:
            routers.append(router)
        rows.append({"seed": seed, "streams": level, "router": router, **f})
        for k, v in f.items():
            cells.setdefault((router, level, k), []).append(v)

    for path in a.reports:
        m = re.search(r"s(\d+)-c(\d+)$", os.path.dirname(os.path.abspath(path)))
        if not m:
            continue
        seed, level = int(m.group(1)), int(m.group(2))
        router = os.path.basename(path).removeprefix("guidellm-").removesuffix(".json")
        add(router, seed, level, figures(path, a.speedup))
    if a.peers_from:
        stored = json.load(open(a.peers_from))
        if stored["speedup"] != a.speedup:
            raise SystemExit(f"{a.peers_from} ran at clock x{stored['speedup']:g}, "
                             f"not x{a.speedup:g}")
        ran = {(r["seed"], r["streams"]) for r in rows}
        for r in stored["reports"]:
            if r["router"] != "kvroute" and (r["seed"], r["streams"]) in ran:
                add(r["router"], r["seed"], r["streams"],
                    {k: r[k] for k in ("ttft_p50", "ttft_p90", "e2e_p50", "rpm", "requests")})
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"speedup": a.speedup, "reports": rows}, out, indent=1)
    print(f"{len(seeds)} runs (GuideLLM data seeds {', '.join(map(str, sorted(seeds)))}), "
          f"clock x{a.speedup:g}; median over the runs [min-max]; times in simulated seconds.\n")
    if a.peers_from:
        print(f"Routers other than kvroute: their figures from {a.peers_from} (earlier runs on "
              f"the same seeds and levels), not re-run here.\n")
    for level in sorted(levels):
        print(f"### {level} concurrent streams\n")
        print("| router | runs | requests per run | " + " | ".join(f[1] for f in FIGURES) + " |")
        print("|---|---:|---:|" + "---:|" * len(FIGURES))
        for r in routers:
            if (r, level, "rpm") not in cells:
                continue
            row = [r, str(len(cells[(r, level, "rpm")])),
                   fmt(cells[(r, level, "requests")], 0)]
            row += [fmt(cells[(r, level, k)], 1 if k == "rpm" else 3) for k, _, _ in FIGURES]
            print("| " + " | ".join(row) + " |")
        peers = [r for r in routers if r.endswith("-cache-aware") and (r, level, "rpm") in cells]
        if "kvroute" in routers and peers and (("kvroute", level, "rpm") in cells):
            print()
            for k, label, lower in FIGURES:
                mine = statistics.median(cells[("kvroute", level, k)])
                best_r = (min if lower else max)(
                    peers, key=lambda p: statistics.median(cells[(p, level, k)]))
                best = statistics.median(cells[(best_r, level, k)])
                ok = mine <= best if lower else mine >= best
                ratio = best / mine if lower else mine / best
                print(f"- {label}: kvroute {mine:.3f} vs best peer {best_r} {best:.3f} "
                      f"({ratio:.2f}x): {'at least as good' if ok else '**worse**'}")
        print()


if __name__ == "__main__":
    main()
