#!/usr/bin/env python3
"""Summarises GuideLLM 0.8.1 JSON reports as a Markdown table.

Reads benchmarks[i].metrics.time_to_first_token_ms.successful.median (and p90, e2e latency,
cached tokens per request when present). The mock workers run their clock --speedup times
faster than the wall clock, so wall-clock times are multiplied back into simulated seconds.
"""
import argparse
import json
import os
import statistics


def dig(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("reports", nargs="+")
    a = ap.parse_args()
    print(f"| policy | benchmark | requests | TTFT p50 (s) | TTFT p90 (s) | e2e p50 (s) | cached/prompt |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for path in a.reports:
        name = os.path.basename(path).removeprefix("guidellm-").removesuffix(".json")
        with open(path) as f:
            report = json.load(f)
        for i, b in enumerate(report.get("benchmarks") or []):
            m = b.get("metrics") or {}
            ttft = dig(m, "time_to_first_token_ms", "successful") or {}
            lat = dig(m, "request_latency", "successful") or {}
            p50 = ttft.get("median")
            p90 = dig(ttft, "percentiles", "p90")
            e2e = lat.get("median")
            reqs = dig(b, "requests", "successful") or []
            prompt = cached = 0
            for r in reqs:
                prompt += r.get("prompt_tokens") or 0
                cached += r.get("cached_tokens") or 0
            fmt = lambda v, scale: "n/a" if v is None else f"{v * scale:.3f}"
            hit = f"{cached / prompt:.1%}" if prompt else "n/a"
            print(f"| {name} | {i} | {len(reqs)} | {fmt(p50, a.speedup / 1e3)} | "
                  f"{fmt(p90, a.speedup / 1e3)} | {fmt(e2e, a.speedup)} | {hit} |")


if __name__ == "__main__":
    main()
