#!/usr/bin/env python3
"""Pools several `e2e/peers/run.sh` outputs (peers.json, one per seed) into one table.

    e2e/peers/pool.py OUT/s*/peers.json > pooled.md
    e2e/peers/pool.py --kvroute-from NEW OUT/s*/peers.json > pooled.md

For each workload and policy: TTFT p50 / p90 and throughput at each concurrency level of the
sweep (the same requests for every policy of a run), as the median over the runs with
[min-max]; then, per workload and level, whether kvroute is at least as good as the best real
peer router (rows whose name ends in `-router-...`) on the median of each figure. Open-loop
levels (`--rate-sweep`) are listed after the closed ones as `R/s` (new sessions per second),
followed by each policy's peak goodput over them (the highest throughput among the rates
whose p90 TTFT <= 8 s) and kvroute's ratio to the best real peer's.

With `--kvroute-from NEW`, each run's kvroute rows come from NEW/s<seed>/peers.json instead
(`e2e/peers/kvroute-alone.sh` on the same seeds and BENCH_ARGS): a new build's rows beside
peer rows measured earlier. A run without such a file, or one of another shape (workloads,
profile, sweep, workers), is an error.
"""
import json
import statistics
import sys

PEER_MARK = "-router-"


def fmt(xs, digits):
    med = statistics.median(xs)
    return f"{med:.{digits}f} [{min(xs):.{digits}f}-{max(xs):.{digits}f}]"


def load(path, kvroute_from):
    run = json.load(open(path))
    if kvroute_from is None:
        return run
    seed = run["config"]["seed"]
    other = f"{kvroute_from}/s{seed}/peers.json"
    try:
        new = json.load(open(other))
    except (OSError, ValueError) as e:
        sys.exit(f"{other}: {e} (kvroute's rows for seed {seed} of {path})")
    if new["config"]["seed"] != seed:
        sys.exit(f"{other}: seed {new['config']['seed']}, not {seed}")
    for key in ("workload_specs",):
        if new.get(key) != run.get(key):
            sys.exit(f"{other}: {key} differ from {path}'s (not the same BENCH_ARGS)")
    for key in ("profile", "sweep", "workers"):
        if new["config"].get(key) != run["config"].get(key):
            sys.exit(f"{other}: config.{key} differs from {path}'s (not the same BENCH_ARGS)")
    for w, res in run["workloads"].items():
        rows = new["workloads"].get(w, {})
        if "kvroute" not in rows:
            sys.exit(f"{kvroute_from}/s{seed}/peers.json: no kvroute rows for {w}")
        res["kvroute"] = rows["kvroute"]
    return run


def main(args):
    kvroute_from = None
    if args[:1] == ["--kvroute-from"] and len(args) >= 2:
        kvroute_from, args = args[1], args[2:]
    paths = args
    if not paths:
        sys.exit("usage: pool.py [--kvroute-from DIR] RUN/peers.json...")
    runs = [load(p, kvroute_from) for p in paths]
    seeds = [r["config"]["seed"] for r in runs]
    speedups = sorted({r["config"]["profile"] for r in runs})
    print(f"{len(runs)} runs, seeds {', '.join(map(str, seeds))}; {'; '.join(speedups)}.")
    print("Median over the runs [min-max]; times in simulated seconds; throughput in requests/min.\n")
    workloads = []
    for r in runs:
        for w in r["workloads"]:
            if w not in workloads:
                workloads.append(w)
    for w in workloads:
        # (policy, level) -> figure -> [values over runs]
        cells = {}
        policies, levels = [], []
        for r in runs:
            for policy, res in r["workloads"].get(w, {}).items():
                if policy not in policies:
                    policies.append(policy)
                for pt in res.get("sweep", []) + res.get("rate_sweep", []):
                    c = level_of(pt)
                    if c not in levels:
                        levels.append(c)
                    d = cells.setdefault((policy, c), {"p50": [], "p90": [], "rpm": [], "n": []})
                    d["p50"].append(pt["ttft_p50_s"])
                    d["p90"].append(pt["ttft_p90_s"])
                    d["rpm"].append(pt["throughput_rpm"])
                    d["n"].append(pt["requests"])
        levels.sort()
        print(f"### {w}\n")
        print("| policy | clients or rate | runs | requests per run | TTFT p50 (s) | TTFT p90 (s) | throughput (req/min) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for c in levels:
            for p in policies:
                d = cells.get((p, c))
                if not d:
                    continue
                print(f"| {p} | {show(c)} | {len(d['n'])} | {statistics.median(d['n']):.0f} | {fmt(d['p50'], 3)} | "
                      f"{fmt(d['p90'], 3)} | {fmt(d['rpm'], 1)} |")
        print()
        peers = [p for p in policies if PEER_MARK in p]
        if "kvroute" in policies and peers:
            print("| clients or rate | figure | kvroute | best real peer | kvroute at least as good |")
            print("|---:|---|---:|---|---|")
            for c in levels:
                k = cells.get(("kvroute", c))
                if not k:
                    continue
                for fig, better_low in (("p50", True), ("p90", True), ("rpm", False)):
                    vals = {p: statistics.median(cells[(p, c)][fig]) for p in peers if (p, c) in cells}
                    if not vals:
                        continue
                    best = (min if better_low else max)(vals, key=vals.get)
                    kv = statistics.median(k[fig])
                    ok = kv <= vals[best] if better_low else kv >= vals[best]
                    name = {"p50": "TTFT p50", "p90": "TTFT p90", "rpm": "throughput"}[fig]
                    print(f"| {show(c)} | {name} | {kv:.3f} | {best} {vals[best]:.3f} | {'yes' if ok else '**no**'} |")
            print()
        open_peaks = {}
        for r in runs:
            for policy, res in r["workloads"].get(w, {}).items():
                g = res.get("peak_goodput_open_rpm")
                if g is not None:
                    open_peaks.setdefault(policy, []).append(g)
        if open_peaks:
            print("Peak goodput over the open-loop rates (req/min, p90 TTFT <= 8 s):\n")
            print("| policy | runs | peak goodput, open loop |")
            print("|---|---:|---:|")
            for p in policies:
                if p in open_peaks:
                    print(f"| {p} | {len(open_peaks[p])} | {fmt(open_peaks[p], 1)} |")
            print()
            peer_peaks = {p: statistics.median(v) for p, v in open_peaks.items() if PEER_MARK in p}
            if "kvroute" in open_peaks and peer_peaks:
                best = max(peer_peaks, key=peer_peaks.get)
                kv = statistics.median(open_peaks["kvroute"])
                ratio = kv / peer_peaks[best] if peer_peaks[best] > 0 else float("inf")
                print(f"kvroute {kv:.1f} against the best real peer's ({best}) {peer_peaks[best]:.1f}: "
                      f"{ratio:.2f}x.\n")


def level_of(pt):
    """A sweep point's level: its clients (closed loop) or ("open", rate)."""
    rate = pt.get("rate_per_s")
    return (1, rate) if rate is not None else (0, pt["concurrency"])


def show(level):
    kind, v = level
    return f"{v:g}/s" if kind else str(v)


if __name__ == "__main__":
    main(sys.argv[1:])
