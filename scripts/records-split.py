#!/usr/bin/env python3
"""Where a run's prediction error sits: warm requests predicted short against the rest.

Reads `kvroute bench --records` files (live or simulated), skips the first 20 requests by
arrival (warm-up), and prints per file the median |predicted - observed| / observed TTFT and
the median observed / predicted ratio of three groups: warm requests (more than half the
prompt cached) predicted below T seconds, warm requests predicted at T or above, and every
request after the warm-up.

    scripts/records-split.py [--below T] DIR/burst-kvroute.jsonl [...]   # T default 0.45
"""
import json
import statistics
import sys

WARMUP = 20


def summary(group):
    if not group:
        return "-", "-", 0
    err = statistics.median(abs(r["predicted_ttft"] - r["ttft"]) / r["ttft"] for r in group)
    ratio = statistics.median(r["ttft"] / r["predicted_ttft"] for r in group)
    return f"{err:.1%}", f"{ratio:.2f}", len(group)


def main(argv):
    below = 0.45
    if len(argv) >= 2 and argv[0] == "--below":
        below = float(argv[1])
        argv = argv[2:]
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print(f"| records | warm, predicted < {below} s: n / error / observed÷predicted "
          f"| warm, the rest | all after warm-up |")
    print("|---|---|---|---|")
    for path in argv:
        with open(path) as f:
            records = sorted((json.loads(line) for line in f if line.strip()),
                             key=lambda r: r["arrival"])
        records = [r for r in records[WARMUP:]
                   if r["predicted_ttft"] is not None and r["predicted_ttft"] == r["predicted_ttft"]
                   and r["predicted_ttft"] > 0 and r["ttft"] > 0]
        warm = [r for r in records if r["cached_tokens"] * 2 > r["prompt_tokens"]]
        cells = []
        for group in ([r for r in warm if r["predicted_ttft"] < below],
                      [r for r in warm if r["predicted_ttft"] >= below],
                      records):
            err, ratio, n = summary(group)
            cells.append(f"{n} / {err} / {ratio}")
        print(f"| {path} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
