#!/usr/bin/env python3
"""Where a run's prefixes went, from the router's decision log (not CI).

    ROUTER_LOG="warn,kvroute_router::decisions=debug" LOGS=DIR ... e2e/guidellm/run.sh
    e2e/guidellm/decisions.py --prefix-tokens 2048 DIR/router-kvroute.log

Classes each decision by what the candidates cached of the prompt's first
`--prefix-tokens` tokens when it was made:
  warm      the chosen worker held the whole prefix
  moved     another worker held it, the chosen one did not
  partial   some worker held part of it, none all
  cold      no worker held any of it (a prefix's first request, or one evicted everywhere)
and prints, per worker, its requests, its cold placements (where new prefixes went) and
the most blocks its index held against its KV capacity. Reads the log's JSON `decision`
fields only (plain or .gz); the log carries no prompt text, so prefixes are not told apart.
"""

import argparse
import collections
import gzip
import json
import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def decisions(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = ANSI.sub("", line)
            i = line.find("decision={")
            if i < 0:
                continue
            try:
                yield json.loads(line[i + len("decision=") :].strip())
            except json.JSONDecodeError as e:
                print(f"{path}: a decision line is not JSON ({e}); skipped", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix-tokens", type=int, required=True)
    ap.add_argument("log")
    a = ap.parse_args()
    classes = collections.Counter()
    requests = collections.Counter()
    cold = collections.Counter()
    cold_reasons = collections.Counter()
    most_blocks = {}
    capacity = {}
    order = []
    for d in decisions(a.log):
        cands = d.get("candidates") or []
        chosen = next((c for c in cands if c["worker"] == d.get("chosen")), None)
        if chosen is None:
            continue
        full = a.prefix_tokens // max(1, chosen["block_size"])
        best = max(c["cached_blocks"] for c in cands)
        if chosen["cached_blocks"] >= full:
            k = "warm"
        elif best >= full:
            k = "moved"
        elif best > 0:
            k = "partial"
        else:
            k = "cold"
        classes[k] += 1
        order.append(k)
        w = d["chosen"]
        requests[w] += 1
        if k == "cold":
            cold[w] += 1
            cold_reasons[d.get("reason", "?")] += 1
        for c in cands:
            most_blocks[c["worker"]] = max(most_blocks.get(c["worker"], 0), c["index_blocks"])
            if c["kv_capacity_tokens"]:
                capacity[c["worker"]] = c["kv_capacity_tokens"] // max(1, c["block_size"])
    total = sum(classes.values())
    if not total:
        sys.exit(f"{a.log}: no decisions (was the decision log on?)")
    print(f"{total} decisions: " + ", ".join(f"{k} {classes[k]}" for k in ("warm", "moved", "partial", "cold")))
    first_cold = order.index("cold") if "cold" in order else 0
    run = 0
    while first_cold + run < len(order) and order[first_cold + run] == "cold":
        run += 1
    later = sum(1 for k in order[first_cold + run :] if k == "cold")
    print(f"cold: {run} in the opening run of colds, {later} after it; by the decision's reason: "
          + ", ".join(f"{r} {n}" for r, n in sorted(cold_reasons.items())))
    print("| worker | requests | cold placements | most blocks in its index | KV capacity, blocks |")
    print("|---|---:|---:|---:|---:|")
    for w in sorted(most_blocks):
        print(f"| {w} | {requests[w]} | {cold[w]} | {most_blocks[w]} | {capacity.get(w, '-')} |")


if __name__ == "__main__":
    main()
