#!/usr/bin/env python3
"""Where a policy's TTFT predictions miss, from `kvroute bench --records DIR` output.

    kvroute bench --mode sim --seed 42 --repeats 1 --concurrency-sweep 32 \\
        --workload multi-turn --policies kvroute --records DIR
    scripts/prediction-breakdown.py DIR/multi-turn-kvroute.jsonl

Skips the first tenth of requests by arrival (the report's warm-up) and prints the median
|predicted - observed| / observed TTFT of the chosen worker, split three ways:
- whether the prefix the router expected cached was there at admission (within 256 tokens);
- the router's committed KV on the chosen worker (its outstanding requests' KV need plus
  expected output, with this request's need) less the worker's reported KV capacity;
- the observed TTFT.
"""

import json
import statistics
import sys


def rel_error(r):
    return abs(r["predicted_ttft"] - r["ttft"]) / r["ttft"]


def chosen(r):
    return next(c for c in r["candidates"] if c["worker"] == r["worker"])


def line(label, rows):
    if not rows:
        return
    ttft = sorted(r["ttft"] for r in rows)
    print(
        f"| {label} | {len(rows)} | {statistics.median(rel_error(r) for r in rows) * 100:.1f}% "
        f"| {ttft[len(ttft) // 2]:.3f} | {ttft[min(len(ttft) - 1, int(len(ttft) * 0.9))]:.3f} |"
    )


def main(path):
    with open(path) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    rows.sort(key=lambda r: r["arrival"])
    rows = [r for r in rows[len(rows) // 10 :] if r["ttft"] > 0 and r["predicted_ttft"] is not None]
    if not rows:
        sys.exit(f"{path}: no requests after warm-up")
    print(f"{path}: {len(rows)} requests after warm-up\n")
    print("| requests | n | median error | TTFT p50 (s) | TTFT p90 (s) |")
    print("|---|---:|---:|---:|---:|")
    line("all", rows)
    expecting = [r for r in rows if chosen(r)["expected_cached_tokens"] >= 256]
    evicted = [r for r in expecting if r["cached_tokens"] < chosen(r)["expected_cached_tokens"] - 256]
    line("expected a cached prefix, found it", [r for r in expecting if r not in evicted])
    line("expected a cached prefix, it was evicted", evicted)
    line("expected none", [r for r in rows if r not in expecting])

    def over(r):
        c = chosen(r)
        return c["active_kv_tokens"] + c["kv_need_tokens"] - c["kv_capacity_tokens"]

    if any(chosen(r)["kv_capacity_tokens"] > 0 for r in rows):
        edges = [float("-inf"), -6000, -3000, 0, 3000, float("inf")]
        for lo, hi in zip(edges, edges[1:]):
            sel = [r for r in rows if lo <= over(r) < hi]
            ev = sum(1 for r in sel if r in evicted)
            line(f"committed KV - capacity in [{lo:g}, {hi:g}) tokens ({ev} evicted)", sel)
    edges = [0, 0.15, 0.3, 0.6, 2.0, float("inf")]
    for lo, hi in zip(edges, edges[1:]):
        line(f"observed TTFT in [{lo:g}, {hi:g}) s", [r for r in rows if lo <= r["ttft"] < hi])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
