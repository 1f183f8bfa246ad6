#!/usr/bin/env bash
# Long runs of the fuzz targets (docs/fuzzing.md). `cargo test` runs the
# same targets with a few hundred iterations each (CI's short budget); this
# runs them with many more, in the `fuzz` profile: optimised like release,
# with overflow checks and debug assertions kept so that they can fail.
#
#   scripts/fuzz.sh [api] [grammar] [sse] [template]   (default: all)
#
# KESTREL_FUZZ_ITERS      iterations per target (default 1000000)
# KESTREL_FUZZ_GRAMMAR_ITERS  the grammar compiler's (default 20000: each
#                         schema compiles three times, milliseconds each)
# KESTREL_FUZZ_SEED       the seed (default 24301)
# Each target's time (its tests run side by side, one thread each) and its
# summary lines are printed; a failure names the target, the seed and the
# iteration that reproduces it.
set -euo pipefail
cd "$(dirname "$0")/.."

iters="${KESTREL_FUZZ_ITERS:-1000000}"
grammar_iters="${KESTREL_FUZZ_GRAMMAR_ITERS:-20000}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(api grammar sse template)

run() {
    local name="$1" n="$2"
    shift 2
    # Built first, so that the time printed is the run's alone.
    cargo test -q --profile fuzz "$@" --no-run
    echo "== $name: $n iterations, seed ${KESTREL_FUZZ_SEED:-24301}"
    local start=$SECONDS
    KESTREL_FUZZ_ITERS="$n" cargo test -q --profile fuzz "$@" -- --nocapture
    echo "== $name: $((SECONDS - start)) s"
}

for target in "${targets[@]}"; do
    case "$target" in
        api) run api "$iters" -p kestrel-api --test fuzz ;;
        grammar) run grammar "$grammar_iters" -p kestrel-structured --test fuzz_schemas ;;
        sse) run sse "$iters" -p kestrel-server --test fuzz_sse ;;
        template) run template "$iters" -p kestrel-text --test fuzz_template ;;
        *)
            echo "unknown target $target (api, grammar, sse, template)" >&2
            exit 2
            ;;
    esac
done
