#!/usr/bin/env bash
# Runs the cargo-fuzz targets for a time budget each and appends one row per run to the
# ledger, docs/fuzzing.md, then recomputes the per-target totals there.
#
#   scripts/fuzz.sh [--seconds N] [--cmin] [--no-nice] [--max-len B] [--until TIME [--goal N]] [TARGET ...]
#   scripts/fuzz.sh --cmin-only [TARGET ...]
#
# TARGET is `crate/target` (e.g. `router/ingest_session`) or a crate name (all its targets);
# none means every target. Each run reads the target's committed corpus
# (<crate>/fuzz/corpus/<target>, where new inputs are written) and its hand-written seeds
# (read only), and stops after N seconds (default 300) or at the first crash, whose input is
# left in <crate>/fuzz/artifacts/<target>/. `--cmin` minimizes each corpus afterwards
# (`cargo fuzz cmin`) so the committed corpus stays small; `--cmin-only` only minimizes.
# Runs are `nice -n 19` unless --no-nice. With `--until TIME` (anything `date -d` reads) it
# keeps going until TIME, each time running the target with the fewest executions in the
# ledger that is still below the goal (`--goal`, default 10 M) and that no other run of this
# script is fuzzing, so two runs side by side share the work. `--max-len B` caps generated
# inputs at B bytes (libFuzzer's -max_len; longer corpus inputs are read truncated): targets
# that check every step of a long input (index_ops) run many more, shorter sequences. Needs
# the nightly toolchain and cargo-fuzz (installed here, pinned, if missing).
#
# Builds use `--sanitizer none` (no crate under fuzz contains `unsafe`, and AddressSanitizer
# costs about half the executions) and `--debug-assertions`, so integer overflow and
# `debug_assert!` fail as crashes. Each fuzz crate builds into its own fuzz/target.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
ledger=$root/docs/fuzzing.md
export CARGO_BUILD_JOBS=${JOBS:-2}

FUZZ_VERSION=0.13.2
ALL_TARGETS=(
    classify/labeller
    crds/parse_documents
    mock-vllm/request_body
    router/anthropic_request router/epp_messages router/index_ops router/ingest_session router/openai_request router/peer_update router/sse_stream router/tenant_credentials
    sidecar/apply_events
    tokenization/chat_request tokenization/fast_path tokenization/tokenizer_config
    vllm-wire/decode_roundtrip vllm-wire/encode_roundtrip
)

seconds=300
cmin=0
cmin_only=0
until=
goal=10000000
maxlen=
nice=(nice -n 19)
wanted=()
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) seconds=$2; shift 2 ;;
        --cmin) cmin=1; shift ;;
        --cmin-only) cmin_only=1; shift ;;
        --until) until=$2; shift 2 ;;
        --goal) goal=$2; shift 2 ;;
        --max-len) maxlen=$2; shift 2 ;;
        --no-nice) nice=(); shift ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) wanted+=("$1"); shift ;;
    esac
done

targets=()
if [ ${#wanted[@]} -eq 0 ]; then
    targets=("${ALL_TARGETS[@]}")
else
    for w in "${wanted[@]}"; do
        found=0
        for t in "${ALL_TARGETS[@]}"; do
            if [ "$t" = "$w" ] || [ "${t%%/*}" = "$w" ]; then targets+=("$t"); found=1; fi
        done
        [ $found = 1 ] || { echo "unknown target: $w (known: ${ALL_TARGETS[*]})" >&2; exit 2; }
    done
fi

if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $FUZZ_VERSION" ]; then
    cargo install --locked "cargo-fuzz@$FUZZ_VERSION"
fi

# Hand-written seed directories for a target, relative to <crate>/fuzz (read only).
seeds_for() {
    local crate=$1 target=$2
    [ -d "$root/$crate/fuzz/seeds/$target" ] && echo "seeds/$target"
    case $crate/$target in
        crds/parse_documents) echo seeds ;;  # the crate's only target: seeds are flat files
        sidecar/apply_events) echo ../../vllm-wire/fuzz/seeds/decode_roundtrip ;;
    esac
    return 0
}

# Appends one ledger row: target, executions, seconds, corpus files, corpus bytes, result, date, command.
ledger_row() {
    local tmp
    tmp=$(mktemp)
    # Insert the row just above the end marker of the runs table.
    awk -v row="$1" '/^<!-- runs:end -->$/ { print row } { print }' "$ledger" > "$tmp"
    cat "$tmp" > "$ledger"
    rm -f "$tmp"
}

# Recomputes the totals table from the runs table, with each corpus as it is on disk now.
ledger_totals() {
    local tmp t
    tmp=$(mktemp)
    for t in "${ALL_TARGETS[@]}"; do
        local c=$root/${t%%/*}/fuzz/corpus/${t#*/}
        [ -d "$c" ] && echo "$t $(find "$c" -type f | wc -l), $(du -sb "$c" | cut -f1)"
    done > "$tmp.sizes"
    awk -F'|' -v sizes="$tmp.sizes" '
        BEGIN { while ((getline line < sizes) > 0) { split(line, p, " "); corpus[p[1]] = substr(line, length(p[1]) + 2) } }
        /^<!-- runs:begin -->$/ { inruns = 1; next }
        /^<!-- runs:end -->$/ { inruns = 0; next }
        inruns && $2 ~ /`/ {
            t = $2; gsub(/[ `]/, "", t)
            e = $3; gsub(/[ ,]/, "", e)
            s = $4; gsub(/ /, "", s)
            execs[t] += e; secs[t] += s; runs[t] += 1
            if ($6 !~ /ok/) crashes[t] += 1
            if (!(t in order)) { order[t] = ++n; names[n] = t }
        }
        END {
            for (i = 1; i <= n; i++) {
                t = names[i]
                printf "| `%s` | %d | %d | %d | %s | %d | %s |\n", t, runs[t], execs[t], secs[t], corpus[t], crashes[t] + 0, (execs[t] >= 10000000 ? "yes" : "no")
            }
        }
    ' "$ledger" > "$tmp.rows"
    awk -v rows="$tmp.rows" '
        /^<!-- totals:begin -->$/ {
            print
            print "| target | runs | executions | seconds | corpus now (files, bytes) | runs ending in a crash | >= 10 M |"
            print "|---|---:|---:|---:|---|---:|---|"
            while ((getline line < rows) > 0) print line
            skip = 1; next
        }
        /^<!-- totals:end -->$/ { skip = 0 }
        !skip { print }
    ' "$ledger" > "$tmp"
    cat "$tmp" > "$ledger"
    rm -f "$tmp" "$tmp.rows" "$tmp.sizes"
}

# Runs one target once: 0 when it ran clean, 1 on a crash (or a failed minimization), 3 when
# skipped because another run of this script is fuzzing it.
run_target() {
    local t=$1 crate target dir log cmd start rc wall execs result art files bytes lock
    crate=${t%%/*}
    target=${t#*/}
    dir=$root/$crate/fuzz
    mkdir -p "$dir/corpus/$target" "$dir/target"
    lock=$dir/target/.fuzz-$target.lock
    exec 8>"$lock"
    flock -n 8 || { exec 8>&-; return 3; }
    mapfile -t seeds < <(seeds_for "$crate" "$target")
    log=$(mktemp)
    cmd=(cargo +nightly fuzz run --sanitizer none --debug-assertions "$target" "corpus/$target" "${seeds[@]}"
        -- -max_total_time="$seconds" -timeout=10 -print_final_stats=1 ${maxlen:+-max_len=$maxlen})
    echo "=== $t: ${cmd[*]}"
    # Build first (not timed), then run.
    (cd "$dir" && cargo +nightly fuzz build --sanitizer none --debug-assertions "$target") ||
        { echo "=== $t: build failed"; exec 8>&-; return 1; }
    start=$(date +%s)
    rc=0
    (cd "$dir" && "${nice[@]}" "${cmd[@]}") > "$log" 2>&1 || rc=$?
    wall=$(( $(date +%s) - start ))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    if [ -z "$execs" ]; then
        # A crash ends the run before the final stats; the last status line has the count.
        execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    fi
    execs=${execs:-0}
    result=ok
    if [ $rc -ne 0 ]; then
        art=$(grep -oE 'artifacts/[^ ]+' "$log" | tail -1 || true)
        result="crash rc=$rc ${art:-no artifact}"
        tail -40 "$log"
    fi
    if [ $cmin = 1 ] && [ $rc -eq 0 ]; then
        (cd "$dir" && "${nice[@]}" cargo +nightly fuzz cmin --sanitizer none --debug-assertions \
            "$target" "corpus/$target" -- -timeout=10) > "$log.cmin" 2>&1 || { tail -20 "$log.cmin"; result="cmin failed"; }
        rm -f "$log.cmin"
    fi
    files=$(find "$dir/corpus/$target" -type f | wc -l)
    bytes=$(du -sb "$dir/corpus/$target" | cut -f1)
    echo "=== $t: $execs executions in $wall s, corpus $files files / $bytes bytes, $result"
    exec 9<"$ledger"
    flock 9  # two runs of this script may share the ledger
    ledger_row "| \`$t\` | $execs | $wall | $files, $bytes | $result | $(date -u +%Y-%m-%dT%H:%MZ) | \`scripts/fuzz.sh --seconds $seconds$([ $cmin = 1 ] && echo ' --cmin')${maxlen:+ --max-len $maxlen} $t\` |"
    ledger_totals
    exec 9<&-
    rm -f "$log"
    exec 8>&-
    [ "$result" = ok ]
}

# Total executions of a target so far, from the ledger's runs table.
total_of() {
    awk -F'|' -v t="\`$1\`" '
        /^<!-- runs:begin -->$/ { inruns = 1; next }
        /^<!-- runs:end -->$/ { inruns = 0 }
        inruns { name = $2; gsub(/ /, "", name); if (name == t) sum += $3 }
        END { print sum + 0 }
    ' "$ledger"
}

status=0
crashed=" "
if [ $cmin_only = 1 ]; then
    # Minimize the named corpora without fuzzing, then refresh the totals' corpus sizes.
    for t in "${targets[@]}"; do
        dir=$root/${t%%/*}/fuzz
        [ -d "$dir/corpus/${t#*/}" ] || continue
        echo "=== $t: cmin"
        (cd "$dir" && "${nice[@]}" cargo +nightly fuzz cmin --sanitizer none --debug-assertions \
            "${t#*/}" "corpus/${t#*/}" -- -timeout=10) > /dev/null 2>&1 || { echo "=== $t: cmin failed"; status=1; }
    done
    exec 9<"$ledger"
    flock 9
    ledger_totals
    exit $status
fi
if [ -z "$until" ]; then
    for t in "${targets[@]}"; do
        run_target "$t" || { rc=$?; [ $rc = 3 ] && echo "=== $t: another run is fuzzing it, skipped" || status=1; }
    done
    exit $status
fi
# --until: until then, run the target (of those named) with the fewest executions that is
# below the goal and not being fuzzed by another run of this script.
deadline=$(date -d "$until" +%s)
while [ $(( $(date +%s) + seconds )) -le "$deadline" ]; do
    mapfile -t order < <(for t in "${targets[@]}"; do echo "$(total_of "$t") $t"; done | sort -n)
    ran=0
    for line in "${order[@]}"; do
        n=${line%% *}
        t=${line#* }
        [ "$n" -ge "$goal" ] && continue
        case $crashed in *" $t "*) continue ;; esac
        rc=0
        run_target "$t" || rc=$?
        [ $rc = 3 ] && continue
        [ $rc = 0 ] || { status=1; crashed="$crashed$t "; }
        ran=1
        break
    done
    [ $ran = 1 ] || { echo "=== every target has $goal executions, or is busy"; break; }
done
exit $status
