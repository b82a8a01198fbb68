#!/usr/bin/env python3
"""Replays kvroute's per-worker TTFT fit over a simulated run's decision records, offline, to
see where the prediction error sits and to try a variant of the fit in seconds instead of a
rebuild and a suite (bench/README.md, "Where the simulated prediction error sits").

    kvroute bench --mode sim --policies kvroute --seed 42 --repeats 1 \\
        --concurrency-sweep 32 --workload independent --records OUT
    scripts/fit-replay.py OUT/independent-kvroute.jsonl [--window N] [--prior-weight W]
        [--overlap] [--chunk TOKENS] [--skip-blind] [--split] [--step-budget TOKENS]
        [--choice-window N] [--choice-margin M]

The replay follows router/src/routing/predict.rs: per worker, the line (seconds per 1,000
prefill tokens, overhead) with the least sum of |relative error| over the last `--window` first
tokens and two points on the prior line (at 0.5 and 4 thousand tokens), by iteratively
reweighted least squares (8 rounds from the last line, residual floor 1%, an overhead outside
[0, 1] s fixed at the bound and the rate refitted), the rate then kept within 4x of the prior.
Events run in time order: a request is predicted at its arrival (line + the running step's
remainder `step_s` + the admission wait the router added) and taught at its first token
(observed TTFT less `step_s`; requests the router predicted an admission wait for teach the
admission model, not the line, and are skipped). x is the queue the router counted plus the
prompt's tokens it expected to compute. Beside it, as predict.rs does, each worker fits the
same kind of line in whole engine steps of `--step-budget` tokens (with work queued, the
running step takes up to one budget of the queue and the rest plus the prompt is rounded up
to whole steps; with nothing queued, the prompt's tokens), and a prediction uses it while its
mean |relative error| over the worker's last 50 first tokens times 1.5 is below the line's
(`--step-budget 0`: the line alone; `--choice-window`, `--choice-margin` to try others). One simplification: the router teaches the queue
before the head's drain (and the drained seconds back on the TTFT); the records hold the
drained queue, which the replay uses for both, so the replay's error differs from the
router's by up to a point (printed side by side).

Prints the median |predicted - observed| / observed after warm-up (the first tenth of
requests by arrival, as the report) and per tenth of the run, for the router as recorded and
for the replay. Variants (not what the router does): --window, --prior-weight (the prior
points' weight; 1 = one sample each), --overlap (take the running step's remainder times the
rate off the queue: the step computes part of it), --chunk TOKENS (round the prefill work up
to whole engine steps of TOKENS), --skip-blind (do not learn from requests predicted before
their worker's line had a sample: the first wave). --split fits one line per worker in hindsight to the first
half of the run after warm-up and prints its error on the second half, next to the router's.
"""

import argparse
import json
import math
import statistics

PRIOR_POINTS_KTOK = (0.5, 4.0)
IRLS_ROUNDS = 8
RESIDUAL_FLOOR = 0.01
RELATIVE_FLOOR_S = 0.05
MAX_OVERHEAD = 1.0
RATE_RANGE = 4.0


def chosen(r):
    return next(c for c in r["candidates"] if c["worker"] == r["worker"])


def features(r, overlap, chunk):
    """(x in thousands of tokens, step_s, admission wait) of the chosen worker at the pick."""
    c = chosen(r)
    queue = c["queue_tokens"]
    step = c["step_s"]
    if overlap and step > 0:
        queue = max(0.0, queue - step * c["prefill_rate"])
    tokens = queue + max(0.0, r["prompt_tokens"] - c["expected_cached_tokens"])
    if chunk:
        tokens = math.ceil(tokens / chunk) * chunk
    return tokens / 1000.0, step, c["admission_wait"]


def whole_steps_x(r, budget):
    """The whole-steps line's x (thousands of tokens; predict.rs `whole_steps_tokens`), or
    None with no budget. A running step shows as `step_s` > 0 (the step share is 1)."""
    if budget <= 0:
        return None
    c = chosen(r)
    queue = max(0.0, c["queue_tokens"])
    own = max(0.0, r["prompt_tokens"] - c["expected_cached_tokens"])
    if queue <= 0:
        return own / 1000.0
    running = min(queue, budget) if c["step_s"] > 0 else 0.0
    return math.ceil((queue - running + own) / budget) * budget / 1000.0


def solve(points, a, b):
    """One reweighting round: the weighted least-squares line through `points`
    [(x, y, whole, multiplier)] with the weights of the line (a, b); None when degenerate."""
    m = [0.0] * 5
    for x, y, whole, mult in points:
        z = max(whole, RELATIVE_FLOOR_S)
        w = mult / (z * z * max(abs(a * x + b - y) / z, RESIDUAL_FLOOR))
        m[0] += w * x * x
        m[1] += w * x
        m[2] += w
        m[3] += w * x * y
        m[4] += w * y
    det = m[0] * m[2] - m[1] * m[1]
    if not math.isfinite(det) or det <= m[0] * m[2] * 1e-12:
        return None
    na = (m[3] * m[2] - m[4] * m[1]) / det
    nb = (m[0] * m[4] - m[1] * m[3]) / det
    bounded = min(max(nb, 0.0), MAX_OVERHEAD)
    if bounded != nb:
        na, nb = (m[3] - bounded * m[1]) / m[0], bounded
    return na, nb


class Line:
    """One worker's windowed least-|relative error| line, as predict.rs fits it."""

    def __init__(self, prior_rate, prior_overhead, window, prior_weight):
        self.prior_a = 1000.0 / prior_rate
        self.a, self.b = self.prior_a, prior_overhead
        self.window, self.samples = window, []
        self.prior = [(x, x * self.prior_a + prior_overhead, x * self.prior_a + prior_overhead,
                       prior_weight) for x in PRIOR_POINTS_KTOK]
        self.lo = 1000.0 / (prior_rate * RATE_RANGE)
        self.hi = 1000.0 / (prior_rate / RATE_RANGE)

    def predict(self, x):
        return self.a * x + self.b

    def learn(self, x, y, whole):
        self.samples = (self.samples + [(x, y, whole, 1.0)])[-self.window:]
        a, b = self.a, self.b
        for _ in range(IRLS_ROUNDS):
            got = solve(self.samples + self.prior, a, b)
            if got is None:
                break
            a, b = got
        self.a = min(max(a, self.lo), self.hi)
        self.b = min(max(b, 0.0), MAX_OVERHEAD)


def replay(rows, args):
    """Predictions of the replayed fit, by row index."""
    events = []
    for i, r in enumerate(rows):
        x, step, wait = features(r, args.overlap, args.chunk)
        xs = whole_steps_x(r, args.step_budget)
        events.append((r["arrival"], 0, i, x, xs, step, wait))
        events.append((r["arrival"] + r["ttft"], 1, i, x, xs, step, wait))
    events.sort(key=lambda e: (e[0], e[1]))
    workers, predicted, both, blind = {}, {}, {}, set()
    for _, kind, i, x, xs, step, wait in events:
        r = rows[i]
        if r["worker"] not in workers:
            c = chosen(r)  # the first pick of a worker shows the prior
            workers[r["worker"]] = {
                "lines": [Line(c["prefill_rate"], c["overhead"], args.window, args.prior_weight)
                          for _ in range(2)],
                "recent": [[], []],
                "whole_steps": False,
            }
        wk = workers[r["worker"]]
        line, steps_line = wk["lines"]
        if kind == 0:
            p_line = line.predict(x) + step + wait
            p_steps = steps_line.predict(xs) + step + wait if xs is not None else None
            both[i] = (p_line, p_steps)
            predicted[i] = p_steps if (wk["whole_steps"] and p_steps is not None) else p_line
            if not line.samples:
                blind.add(i)
        elif wait == 0 and not (args.skip_blind and i in blind):
            line.learn(x, r["ttft"] - step, r["ttft"])
            p_line, p_steps = both[i]
            keep = args.choice_window
            wk["recent"][0] = (wk["recent"][0] + [abs(p_line - r["ttft"]) / r["ttft"]])[-keep:]
            if p_steps is not None:
                steps_line.learn(xs, r["ttft"] - step, r["ttft"])
                wk["recent"][1] = (wk["recent"][1]
                                   + [abs(p_steps - r["ttft"]) / r["ttft"]])[-keep:]
            e_line, e_steps = wk["recent"]
            wk["whole_steps"] = bool(e_line and e_steps) and (
                statistics.mean(e_steps) * args.choice_margin < statistics.mean(e_line))
    return predicted


def errors(rows, predicted):
    return [abs(predicted[i] - r["ttft"]) / r["ttft"] for i, r in enumerate(rows)]


def med(values):
    return 100.0 * statistics.median(values) if values else float("nan")


def hindsight_split(rows, skip):
    """Per worker, the least-|relative error| line fitted to the first half after warm-up,
    and the median error of it and of the router on the second half."""
    after = rows[skip:]
    half = len(after) // 2
    first, second = after[:half], after[half:]
    mine, router = [], []
    for w in sorted({r["worker"] for r in after}):
        pts = []
        for r in first:
            if r["worker"] != w:
                continue
            x, step, wait = features(r, False, 0)
            if wait == 0:
                pts.append((x, r["ttft"] - step, r["ttft"], 1.0))
        a, b = 1.0, 0.0
        for _ in range(30):
            got = solve(pts, a, b)
            if got is None:
                break
            a, b = got
        for r in second:
            if r["worker"] != w:
                continue
            x, step, wait = features(r, False, 0)
            mine.append(abs(a * x + b + step + wait - r["ttft"]) / r["ttft"])
            router.append(abs(r["predicted_ttft"] - r["ttft"]) / r["ttft"])
    return med(mine), med(router)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", help="a --records JSONL file of one policy (kvroute)")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--prior-weight", type=float, default=1.0)
    p.add_argument("--overlap", action="store_true")
    p.add_argument("--chunk", type=int, default=0)
    p.add_argument("--skip-blind", action="store_true")
    p.add_argument("--split", action="store_true")
    p.add_argument("--step-budget", type=float, default=2048.0,
                   help="the whole-steps line's step budget (tokens; 0: the line alone)")
    p.add_argument("--choice-window", type=int, default=50,
                   help="first tokens over which the two lines' errors are compared")
    p.add_argument("--choice-margin", type=float, default=1.5,
                   help="the whole-steps line is used while its mean error times this is "
                        "below the line's")
    args = p.parse_args()
    rows = [json.loads(line) for line in open(args.records)]
    rows = [r for r in rows if r.get("predicted_ttft") is not None and r["ttft"] > 0]
    rows.sort(key=lambda r: r["arrival"])
    skip = len(rows) // 10
    recorded = {i: r["predicted_ttft"] for i, r in enumerate(rows)}
    n = len(rows)
    print(f"{args.records}: {n} requests, {n - skip} after warm-up")
    print("| fit | after warm-up | " + " | ".join(f"tenth {d + 1}" for d in range(10)) + " |")
    print("|---|---:|" + "---:|" * 10)
    for name, pred in (("router (recorded)", recorded), ("replay", replay(rows, args))):
        e = errors(rows, pred)
        tenths = [med(e[d * n // 10:(d + 1) * n // 10]) for d in range(10)]
        print(f"| {name} | {med(e[skip:]):.1f}% | "
              + " | ".join(f"{t:.1f}%" for t in tenths) + " |")
    if args.split:
        mine, router = hindsight_split(rows, skip)
        print(f"\nsecond half after warm-up: a line per worker fitted in hindsight to the first "
              f"half {mine:.1f}%, the router {router:.1f}%")


if __name__ == "__main__":
    main()
