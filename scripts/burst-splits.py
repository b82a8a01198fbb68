#!/usr/bin/env python3
"""Why a policy split bursts of one new prefix over several workers, from
`kvroute bench --mode sim --workload burst --records DIR` output.

    kvroute bench --mode sim --workload burst --policies kvroute --seed 832746533 \\
        --sessions 768 --generic-prior --prefix-tokens 16384 --question-tokens 1024 \\
        --output-tokens 128 --profile l40s-27b-fp8 --concurrency-sweep=, --rate 5.5 \\
        --records DIR
    scripts/burst-splits.py DIR/burst-kvroute.jsonl [BURST]

A burst is BURST consecutive requests by arrival (default 24: the workload's 768 sessions over
its 32 prefixes). Counts the bursts whose requests went to more than one worker and, for each
request sent to a worker that held no earlier request of its burst, which term of kvroute's
score moved it off the burst's workers so far:

- hot-copy: the hot-prefix rule made a copy (every holder's score is the rule's 'not a copy'
  sentinel, f64::MAX);
- block-balance: the best holder's score exceeds its prediction (the KV-block balance charge;
  a holder pays no cache-affinity charge);
- prediction: neither: the prediction itself placed another worker sooner.

The first such move of a burst is the burst's cause.
"""

import collections
import json
import sys


def main(path, size):
    rows = [json.loads(line) for line in open(path)]
    rows.sort(key=lambda r: r['arrival'])
    first_cause = collections.Counter()
    move_cause = collections.Counter()
    bursts = len(rows) // size
    for b in range(bursts):
        burst = rows[b * size:(b + 1) * size]
        holders = {burst[0]['worker']}
        first = None
        for r in burst[1:]:
            if r['worker'] in holders:
                continue
            held = [c for c in r['candidates'] if c['worker'] in holders]
            best = min(held, key=lambda c: c['score'])
            if best['score'] > 1e300:
                cause = 'hot-copy'
            elif best['score'] - best['predicted_ttft'] > 1e-6:
                cause = 'block-balance'
            else:
                cause = 'prediction'
            move_cause[cause] += 1
            first = first or cause
            holders.add(r['worker'])
        if first:
            first_cause[first] += 1
    split = sum(first_cause.values())
    print(f'{path}: {split} of {bursts} bursts split')
    for cause in ('hot-copy', 'block-balance', 'prediction'):
        print(f'  {cause}: {first_cause[cause]} bursts, {move_cause[cause]} moves to a new worker')


if __name__ == '__main__':
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 24)
