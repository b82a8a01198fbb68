#!/usr/bin/env python3
"""Lists every request no candidate caches any of (a burst's first request, a new prefix) from
`kvroute bench --records DIR` output, with each candidate's prediction, the simulator's true
TTFT there, its score, learned overhead, pooled rate, queue, predicted wait for KV and load.

usage: scripts/burst-firsts.py DIR/burst-kvroute.jsonl
"""
import json
import sys


def main(path):
    recs = [json.loads(line) for line in open(path)]
    recs.sort(key=lambda r: r["arrival"])
    n = 0
    for r in recs:
        cs = r["candidates"]
        if any(c["expected_cached_tokens"] > 0 for c in cs):
            continue
        n += 1
        print(f"#{n} t={r['arrival']:.1f} chose w{r['worker']} ttft={r['ttft']:.2f} reason={r['reason']}")
        for c, t in zip(cs, r["true_ttfts"]):
            print(
                f"   w{c['worker']} pred={c['predicted_ttft']:.2f} true={t:.2f} score={c['score']:.2f}"
                f" ovh={c['overhead']:.2f} rate={c['pooled_rate']:.0f} q={c['queue_tokens']:.0f}"
                f" adm={c['admission_wait']:.2f} act_blk={c['active_blocks']} kvu={c['kv_usage']:.2f}"
                f" run={c['running']} wait={c['waiting']} dec={c['decoding']} need={c['kv_need_tokens']}"
            )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
