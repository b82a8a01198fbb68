#!/usr/bin/env python3
"""Where a policy's TTFT predictions miss, from `kvroute bench --records DIR` output.

    kvroute bench --mode sim --seed 42 --repeats 1 --concurrency-sweep 32 \\
        --workload multi-turn --policies kvroute --records DIR
    scripts/prediction-breakdown.py DIR/multi-turn-kvroute.jsonl
    scripts/prediction-breakdown.py DIR/multi-turn-kvroute.jsonl --fit-at 26.5
    scripts/prediction-breakdown.py DIR/multi-turn-kvroute.jsonl --best-line

Skips the first tenth of requests by arrival (the report's warm-up) and prints the median
|predicted - observed| / observed TTFT of the chosen worker, split three ways:
- whether the prefix the router expected cached was there at admission (within 256 tokens);
- the router's committed KV on the chosen worker (its outstanding requests' KV need plus
  expected output, with this request's need) less the worker's reported KV capacity;
- the observed TTFT.

It also counts, over every request and candidate, how often the candidate's distinct
outstanding prompt blocks with this prompt exceeded 90% of its reported KV: where kvroute's
KV-block charge (`block_balance_kv_share`) may apply.

With `--fit-at T`: per worker, the first tokens it returned by simulated time T (x = queue
plus uncached tokens the router saw, y = observed TTFT), their mix (x below or above 1,000
tokens), and the prefill rate and overhead a batch least-squares fit of them gives, each
sample weighted by one over its prediction squared as the router's own fit weighs it
(`router/src/routing/predict.rs`). Set beside the rates the router had learned online.
"""

import json
import statistics
import sys


def rel_error(r):
    return abs(r["predicted_ttft"] - r["ttft"]) / r["ttft"]


def chosen(r):
    """The chosen worker's candidate, looked up once per record."""
    if "_chosen" not in r:
        r["_chosen"] = next(c for c in r["candidates"] if c["worker"] == r["worker"])
    return r["_chosen"]


def load(path):
    """Every record of a --records file, by arrival."""
    with open(path) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    rows.sort(key=lambda r: r["arrival"])
    return rows


def line(label, rows):
    if not rows:
        return
    ttft = sorted(r["ttft"] for r in rows)
    print(
        f"| {label} | {len(rows)} | {statistics.median(rel_error(r) for r in rows) * 100:.1f}% "
        f"| {ttft[len(ttft) // 2]:.3f} | {ttft[min(len(ttft) - 1, int(len(ttft) * 0.9))]:.3f} |"
    )


def after_warmup(everything, path):
    """The requests after the report's warm-up (the first tenth by arrival) that have a first
    token and a prediction; exits when there are none."""
    rows = [
        r
        for r in everything[len(everything) // 10 :]
        if r["ttft"] > 0 and r["predicted_ttft"] is not None
    ]
    if not rows:
        sys.exit(f"{path}: no requests after warm-up")
    print(f"{path}: {len(rows)} requests after warm-up\n")
    return rows


def main(path):
    everything = load(path)
    rows = after_warmup(everything, path)
    print("| requests | n | median error | TTFT p50 (s) | TTFT p90 (s) |")
    print("|---|---:|---:|---:|---:|")
    line("all", rows)
    for r in rows:
        expected = chosen(r)["expected_cached_tokens"]
        r["_expecting"] = expected >= 256
        r["_evicted"] = r["_expecting"] and r["cached_tokens"] < expected - 256
    found = [r for r in rows if r["_expecting"] and not r["_evicted"]]
    line("expected a cached prefix, found it", found)
    line("expected a cached prefix, it was evicted", [r for r in rows if r["_evicted"]])
    line("expected none", [r for r in rows if not r["_expecting"]])

    def over(r):
        c = chosen(r)
        return c["active_kv_tokens"] + c["kv_need_tokens"] - c["kv_capacity_tokens"]

    if any(chosen(r)["kv_capacity_tokens"] > 0 for r in rows):
        edges = [float("-inf"), -6000, -3000, 0, 3000, float("inf")]
        for lo, hi in zip(edges, edges[1:]):
            sel = [r for r in rows if lo <= over(r) < hi]
            ev = sum(1 for r in sel if r["_evicted"])
            line(f"committed KV - capacity in [{lo:g}, {hi:g}) tokens ({ev} evicted)", sel)
    edges = [0, 0.15, 0.3, 0.6, 2.0, float("inf")]
    for lo, hi in zip(edges, edges[1:]):
        line(f"observed TTFT in [{lo:g}, {hi:g}) s", [r for r in rows if lo <= r["ttft"] < hi])
    gate(everything)


def gate(rows):
    """Candidate evaluations over the KV-block charge's 90% gate, over every record."""
    seen = over = 0
    top = 0.0
    for r in rows:
        for c in r["candidates"]:
            cap = c["kv_capacity_tokens"]
            if cap <= 0:
                continue
            seen += 1
            blocks = c["active_blocks"] + max(0, c["prompt_blocks"] - c["in_use_blocks"])
            share = blocks * c["block_size"] / cap
            top = max(top, share)
            over += share > 0.9
    print(f"\nall {len(rows)} requests: {over} of {seen} candidate evaluations had distinct "
          f"outstanding blocks above 90% of the reported KV (largest share {top:.2f})")


def weighted_fit(samples):
    """(rate tok/s, overhead s) of a least-squares line through (ktokens, ttft, predicted)
    samples, each weighted by 1 / max(predicted, 0.05)^2 as predict.rs weighs them; None
    when the fit is degenerate."""
    fit = line_fit([(x, y) for x, y, _ in samples], [1.0 / max(p, 0.05) ** 2 for _, _, p in samples])
    if fit is None or fit[0] <= 0:
        return None
    return (1000.0 / fit[0], fit[1])


def line_fit(samples, weights):
    """(seconds per ktoken, overhead s) of the weighted least-squares line through (x, y)
    samples; None when degenerate."""
    s00 = s01 = s11 = v0 = v1 = 0.0
    for (x, y), wt in zip(samples, weights):
        s00 += wt * x * x
        s01 += wt * x
        s11 += wt
        v0 += wt * x * y
        v1 += wt * y
    det = s00 * s11 - s01 * s01
    if det <= 0:
        return None
    return ((v0 * s11 - v1 * s01) / det, (s00 * v1 - s01 * v0) / det)


def best_line(samples):
    """The line with the least sum of relative absolute errors through (ktokens, ttft)
    samples, and its median relative error; None when degenerate."""
    weights = [1.0 / y**2 for _, y in samples]
    fit = None
    for _ in range(60):
        fit = line_fit(samples, weights)
        if fit is None:
            return None
        rel = [abs(fit[0] * x + fit[1] - y) / y for x, y in samples]
        weights = [1.0 / (y**2 * max(e, 1e-3)) for (_, y), e in zip(samples, rel)]
    return fit, statistics.median(rel)


def best_lines(path):
    rows = after_warmup(load(path), path)
    print("| worker | requests | router's median error | best line in hindsight: median error "
          "| its rate (tok/s), overhead (s) |")
    print("|---|---:|---:|---:|---|")
    groups = [(w, [r for r in rows if r["worker"] == w]) for w in sorted({r["worker"] for r in rows})]
    for w, sel in groups + [("all", rows)]:
        samples = []
        for r in sel:
            c = chosen(r)
            x = c["queue_tokens"] + max(0.0, r["prompt_tokens"] - c["expected_cached_tokens"])
            samples.append((x / 1000.0, r["ttft"]))
        router = statistics.median(rel_error(r) for r in sel)
        got = best_line(samples) if len(samples) >= 3 else None
        if got is None or got[0][0] <= 0:
            print(f"| {w} | {len(sel)} | {router * 100:.1f}% | - | - |")
            continue
        (a, b), err = got
        print(f"| {w} | {len(sel)} | {router * 100:.1f}% | {err * 100:.1f}% "
              f"| {1000.0 / a:.0f}, {b:.3f} |")


def mix(samples):
    if not samples:
        return "0"
    return f"{len(samples)}, {statistics.median(s[1] for s in samples):.3f}"


def fit_at(path, t):
    rows = load(path)
    workers = sorted({r["worker"] for r in rows})
    before = [r for r in rows if r["arrival"] <= t]
    print(f"{path}: first tokens by {t:g} s\n")
    print("| worker | samples | x < 1,000: n, TTFT p50 (s) | x >= 1,000: n, TTFT p50 (s) "
          "| batch fit: rate (tok/s), overhead (s) | router's rate at the last decision before |")
    print("|---|---:|---|---|---|---:|")
    for w in workers:
        samples = []
        for r in rows:
            if r["worker"] != w or r["arrival"] + r["ttft"] > t:
                continue
            c = chosen(r)
            x = c["queue_tokens"] + max(0.0, r["prompt_tokens"] - c["expected_cached_tokens"])
            samples.append((x / 1000.0, r["ttft"], r["predicted_ttft"]))
        fitted = weighted_fit(samples)
        fit = "-" if fitted is None else f"{fitted[0]:.0f}, {fitted[1]:.3f}"
        learned = "-"
        if before:
            c = next((c for c in before[-1]["candidates"] if c["worker"] == w), None)
            if c is not None:
                learned = f"{c['prefill_rate']:.0f}"
        print(f"| {w} | {len(samples)} | {mix([s for s in samples if s[0] < 1.0])} "
              f"| {mix([s for s in samples if s[0] >= 1.0])} | {fit} | {learned} |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--fit-at":
        fit_at(sys.argv[1], float(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[2] == "--best-line":
        best_lines(sys.argv[1])
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
