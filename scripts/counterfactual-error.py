#!/usr/bin/env python3
"""How far a policy's TTFT predictions are from each candidate's counterfactual first token,
from `kvroute bench --mode sim --records DIR` output (every request is simulated on every
worker, so each candidate's prediction has a truth, not only the chosen one's).

    kvroute bench --mode sim --workload burst --policies kvroute --seed 454812531 \\
        --sessions 768 --generic-prior --prefix-tokens 16384 --question-tokens 1024 \\
        --output-tokens 128 --profile l40s-27b-fp8 --concurrency-sweep=, --rate 5.5 \\
        --records DIR
    scripts/counterfactual-error.py DIR/burst-kvroute.jsonl

Skips the first tenth of requests by arrival (the report's warm-up) and prints the median
|predicted - true| / true TTFT over every (request, candidate) pair and over the chosen
workers alone, overall and for the candidates with a predicted wait for KV
(`admission_wait` > 0), and the median signed error (> 0: predicted too high).
"""

import json
import statistics
import sys


def main(path):
    rows = [json.loads(line) for line in open(path)]
    rows.sort(key=lambda r: r['arrival'])
    rows = rows[len(rows) // 10:]
    groups = {'every candidate': [], 'chosen': [], 'waiting for KV': []}
    signed = []
    for r in rows:
        for c, true in zip(r['candidates'], r['true_ttfts']):
            if not (true > 0 and c['predicted_ttft'] < 1e300):
                continue
            err = (c['predicted_ttft'] - true) / true
            groups['every candidate'].append(abs(err))
            signed.append(err)
            if c['worker'] == r['worker']:
                groups['chosen'].append(abs(err))
            if c['admission_wait'] > 0:
                groups['waiting for KV'].append(abs(err))
    print(f'{path}: {len(rows)} requests after the warm-up')
    for name, errs in groups.items():
        if errs:
            print(f'  {name}: median error {100 * statistics.median(errs):.1f}% ({len(errs)})')
    if signed:
        print(f'  every candidate: median signed error {100 * statistics.median(signed):+.1f}%')


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
