#!/usr/bin/env python3
"""Whether two simulated runs routed the same: every figure of two directories of
`kvroute bench --json` files compared, prediction figures left out.

A rule that changes only what the router publishes (its prediction, error and bound) must
leave every TTFT, goodput, cache-hit, split and sweep figure as it was. This walks every JSON
file present in both directories (`scripts/sim-compare.sh` writes one per run) and counts the
values that differ outside the prediction fields (`prediction`, `prediction_error_rel`) and
the run's `config` (which names the build's settings).

    scripts/sim-routing-diff.py DIR_A DIR_B      # exit 1 when a routing figure differs
"""
import json
import math
import os
import sys

SKIP = {"prediction", "prediction_error_rel", "config"}


def walk(a, b, path, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in SKIP:
                continue
            if k not in a or k not in b:
                out["diff"].append(f"{path}/{k}: only in one")
                continue
            walk(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out["diff"].append(f"{path}: {len(a)} against {len(b)} items")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}/{i}", out)
    else:
        out["values"] += 1
        same = a == b or (isinstance(a, float) and isinstance(b, float)
                          and math.isnan(a) and math.isnan(b))
        if not same:
            out["diff"].append(f"{path}: {a} -> {b}")


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    da, db = argv
    names = sorted(n for n in os.listdir(da)
                   if n.endswith(".json") and os.path.exists(os.path.join(db, n)))
    out = {"values": 0, "diff": []}
    for n in names:
        with open(os.path.join(da, n)) as fa, open(os.path.join(db, n)) as fb:
            walk(json.load(fa), json.load(fb), n, out)
    for d in out["diff"][:20]:
        print(d)
    print(f"{len(names)} files, {out['values']} values outside the prediction fields, "
          f"{len(out['diff'])} differ")
    return 1 if out["diff"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
