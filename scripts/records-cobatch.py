#!/usr/bin/env python3
"""How much of a prediction error is requests that join the same engine step later.

Reads a simulated run's records (`kvroute bench --mode sim ... --records DIR`, which keep each
decision's candidates) and prints, after the first 20 requests (warm-up), the median
|predicted - observed| / observed TTFT as recorded, then with each prediction raised by the
uncached tokens of the requests routed to the same worker within W seconds after it, at the
chosen candidate's prefill rate. That is an oracle: the router cannot know those arrivals when
it predicts. It bounds what a model of "later arrivals share my step" could gain.

    scripts/records-cobatch.py DIR/burst-kvroute.jsonl [...]

W: `step` (the chosen candidate's counted step remainder, `step_s`) and 1, 20 and 50 ms.
"""
import json
import statistics
import sys

WARMUP = 20


def errors(records, window):
    base, raised = [], []
    for i, r in enumerate(records):
        p = r["predicted_ttft"]
        cands = r.get("candidates") or []
        if p is None or p != p or r["worker"] >= len(cands) or r["ttft"] <= 0:
            continue
        c = cands[r["worker"]]
        w = c["step_s"] if window == "step" else float(window)
        later = 0.0
        for q in records[i + 1:]:
            if q["arrival"] > r["arrival"] + w:
                break
            if q["worker"] == r["worker"]:
                later += q["prompt_tokens"] - q["cached_tokens"]
        if i >= WARMUP and c["prefill_rate"] > 0:
            base.append(abs(p - r["ttft"]) / r["ttft"])
            raised.append(abs(p + later / c["prefill_rate"] - r["ttft"]) / r["ttft"])
    return base, raised


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("| records | window | requests | median error as recorded | with later arrivals counted |")
    print("|---|---|---:|---:|---:|")
    for path in paths:
        with open(path) as f:
            records = sorted((json.loads(line) for line in f if line.strip()),
                             key=lambda r: r["arrival"])
        if not any(r.get("candidates") for r in records):
            print(f"{path}: no candidates in the records (a live run?)", file=sys.stderr)
            return 1
        for window in ("step", "0.001", "0.02", "0.05"):
            base, raised = errors(records, window)
            if not base:
                continue
            print(f"| {path} | {window} | {len(base)} | {statistics.median(base):.1%} "
                  f"| {statistics.median(raised):.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
