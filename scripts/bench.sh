#!/usr/bin/env bash
# gpushim benchmarks on the simulated driver (figures, not a test), per GPUSHIM_MEMORY_MODE:
# "no shim", passthrough, grow, preallocate. A mode this build of the shim refuses (a
# configuration error, "... is not available in this version") is reported as "not available
# yet" in its row; any other failure as "error: <the shim's message>; <the program's last stderr
# line>". Nothing here fails the script except a failed build.
#
#  1. Overhead of cuMemAlloc_v2(4 KiB) + cuMemFree_v2 pairs, GPUSHIM_MEMORY_LIMIT=8GiB on one
#     simulated 16 GiB device (scripts/bench/alloc_pairs.c):
#     - instructions per pair, callgrind --toggle-collect=run_pairs (the measured loop only; the
#       warm-up, which also grows the grow mode's first chunk, is outside it); needs valgrind,
#       skipped without it;
#     - wall time per pair, one thread, best of 3;
#     - pairs per second of 8 threads, best of 3, and its ratio to "no shim".
#     In grow/preallocate a served cuMemFree also synchronises the context (cuCtxSynchronize),
#     which is part of their figures.
#  2. Fragmentation (scripts/bench/fragmentation.c): one seeded randomized trace of mixed sizes
#     (log-uniform 512 B..64 MiB, 30% from 512 B..64 KiB, 5% through cuMemAllocPitch) keeping
#     its live set near a target fraction of GPUSHIM_MEMORY_LIMIT=2GiB on a 16 GiB device; the
#     trace is the same in every mode (it does not depend on what succeeds). Per mode: share of
#     allocation requests that succeeded (all, and by size class <=1 MiB / <=10 MiB / larger),
#     share of requested bytes that fit, peak live bytes / limit, live bytes / limit at the first
#     refusal, and from the simulator's exit report (GPUSIM_REPORT) the driver's peak use / limit
#     (in grow/preallocate: how far the reserve grew) and how many cuMemAlloc_v2 /
#     cuMemAllocPitch_v2 calls reached the driver. The reference rows: "no shim" runs on a
#     simulated device of exactly the limit's size; passthrough accounts exactly, so both admit
#     every request of the trace (its ideal live set never exceeds the target); what
#     grow/preallocate lose to that is what their reserve wastes.
#  3. Placement log (GPUSHIM_LOG_PLACEMENT): instructions per cuLaunchKernel (callgrind
#     --toggle-collect=run_launches, scripts/bench/launches.c) without the shim, with the shim
#     and the log off (the driver's own cuLaunchKernel is handed out: nothing added), and with
#     the log on; needs valgrind.
#  3b. Compute limit (--only compute): instructions per cuLaunchKernel as in 3, without the shim,
#     with it and no limit, at GPUSHIM_COMPUTE_LIMIT=100% (no limit: the driver's own function)
#     and at 90% in duty mode (the pacer's events and clock; the simulated kernels take no time,
#     so no launch waits), in all and in libgpushim.so itself; needs valgrind.
#  4. Load cost (--only load): instructions of /bin/true (callgrind, whole program) alone and
#     with LD_PRELOAD=libgpushim.so (a process that never touches CUDA pays only this), and the
#     library's size on disk; needs valgrind.
#  5. Start-up (--only startup): instructions of a CUDA runtime program (cudart 12 from the
#     wheels: cudaMalloc of 1 MiB, cudaFree; scripts/bench/rt_startup.c), whole program under
#     callgrind, without the shim, with it and no limit, and with GPUSHIM_MEMORY_LIMIT; then
#     each step of the shim's start-up counted by name (inclusive instructions, with a build
#     of the same code that keeps its symbols: cargo's "profiling" profile); needs valgrind.
#  6. Side by side with HAMi-core (--only hami): HAMi-core at a pinned commit, built as its
#     users build it (scripts/fetch-hami-core.sh; HAMI_CORE_GIT=URL-or-local-git-dir, default
#     GitHub; kept in ${HAMI_CORE_CACHE:-~/.cache/gpushim-bench}, never in the repository),
#     limit 8 GiB (CUDA_DEVICE_MEMORY_LIMIT=8g), against gpushim (passthrough, limit 8 GiB) and
#     no shim, on the same simulated driver and the same programs: the pairs of section 1
#     reached through dlopen + dlsym (HAMi-core intercepts only there: it exports dlsym alone;
#     alloc_pairs.c built with -DVIA_DLSYM), with system calls per pair (strace -c, 2N pairs
#     minus N), the load cost and the start-up. If HAMi-core cannot be built, its rows say why.
#
# Usage: scripts/bench.sh [PAIRS] [--only overhead|fragmentation|placement|compute|load|startup|hami] [--steps N] [--targets "F ..."]
#                         [--seed N]
#   PAIRS      callgrind pairs (default 20000); one thread times 10 x PAIRS pairs, each of the
#              8 threads 5 x PAIRS
#   --steps    fragmentation steps per run (default 50000); --targets live-set targets, fractions
#              of the limit (default "0.75 0.9"); --seed (default 1)
# Builds the release artifacts (gpushim, gpusim-cuda) into ${CARGO_TARGET_DIR:-target}.
# Takes about 40 s on 2 cores after the build (most of it the 8-thread runs of "no shim" and
# passthrough, whose every pair maps and unmaps memory in the simulator); a full release build
# of the two crates adds about 30 s.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=20000 only="" steps=50000 targets="0.75 0.9" seed=1
while (($#)); do
    case $1 in
        --only) only=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --targets) targets=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        [0-9]*) pairs=$1; shift ;;
        *) echo "bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case $only in ""|overhead|fragmentation|placement|compute|load|startup|hami) ;; *) echo "bench: --only overhead|fragmentation|placement|compute|load|startup|hami" >&2; exit 2 ;; esac
started=$SECONDS
target=${CARGO_TARGET_DIR:-$PWD/target}
bash scripts/fetch-deps.sh >/dev/null
cargo build --release -q -p gpushim -p gpusim-cuda -p gpusim-nvml
[[ -n $only && $only != startup ]] || cargo build --profile profiling -q -p gpushim --lib
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$target/release/libcuda.so" "$work/libcuda.so.1"
ln -s "$target/release/libcuda.so" "$work/libcuda.so"
ln -s "$target/release/libnvidia_ml.so" "$work/libnvidia-ml.so.1"
cflags=(-O2 -I.deps/cuda12/include -L"$work")
gcc "${cflags[@]}" -o "$work/alloc_pairs" scripts/bench/alloc_pairs.c -lcuda -lpthread
gcc -O2 -DVIA_DLSYM -I.deps/cuda12/include -o "$work/alloc_pairs_dlsym" scripts/bench/alloc_pairs.c -ldl -lpthread
gcc "${cflags[@]}" -o "$work/fragmentation" scripts/bench/fragmentation.c -lcuda -lm
gcc "${cflags[@]}" -o "$work/launches" scripts/bench/launches.c -lcuda
gcc -O2 -I.deps/cuda12/include -o "$work/rt_startup" scripts/bench/rt_startup.c .deps/cuda12/lib/libcudart.so.12 \
    -Wl,-rpath,"$PWD/.deps/cuda12/lib"
shim="$target/release/libgpushim.so"
# A clean environment: nothing inherited may change what the shim or the simulator does.
for v in $(compgen -e); do
    case $v in GPUSHIM_*|CUDA_DEVICE_MEMORY_LIMIT*|GPUSIM_*|LD_PRELOAD|CUDA_VISIBLE_DEVICES) unset "$v" ;; esac
done
export LD_LIBRARY_PATH="$work" GPUSIM_DEVICES=1 GPUSIM_MEMORY=16GiB
modes=(none passthrough grow preallocate)
label() { [[ $1 == none ]] && echo "no shim" || echo "$1"; }

# run_mode MODE [VAR=value ...] PROGRAM ARGS...: the program without the shim (MODE none) or
# with it in that GPUSHIM_MEMORY_MODE.
run_mode() {
    local mode=$1; shift
    if [[ $mode == none ]]; then env "$@"; else env LD_PRELOAD="$shim" GPUSHIM_MEMORY_MODE="$mode" "$@"; fi
}
# why_failed STDERR-FILE: the cell text of a failed run.
why_failed() {
    if grep -q "not available in this version" "$1"; then
        echo "not available yet ($(grep -m1 "not available in this version" "$1" | sed 's/^gpushim: //'))"
    else # the shim's own message (not a warning) if it printed one, and the program's last line
        local shim_msg last
        shim_msg=$(grep -E '^gpushim: ' "$1" | grep -v '^gpushim: warn' | head -1 || true)
        last=$(grep -v '^==[0-9]*==' "$1" | grep . | tail -1 || true)
        echo "error: ${shim_msg:+$shim_msg; }${last:-no message}"
    fi
}
declare -A unavailable=()
# Probe each mode once: a mode the shim refuses is reported once per section, not per cell.
for m in "${modes[@]}"; do
    if ! run_mode "$m" GPUSHIM_MEMORY_LIMIT=8GiB "$work/alloc_pairs" single 10 >/dev/null 2>"$work/probe.err"; then
        unavailable[$m]=$(why_failed "$work/probe.err")
    fi
done

overhead() {
    local lim=8GiB single=$((pairs * 10)) n8=$((pairs * 5)) m have_cg=1
    command -v valgrind >/dev/null || have_cg=0
    declare -A ins=() ns=() rate=() err=()
    for m in "${modes[@]}"; do
        [[ -n ${unavailable[$m]:-} ]] && continue
        if ((have_cg)); then
            if run_mode "$m" GPUSHIM_MEMORY_LIMIT=$lim valgrind --tool=callgrind --toggle-collect=run_pairs \
                --callgrind-out-file="$work/cg.out" "$work/alloc_pairs" callgrind "$pairs" >/dev/null 2>"$work/cg.err"; then
                ins[$m]=$(grep -E '^summary:|^totals:' "$work/cg.out" | head -1 | awk '{print $2}')
            else
                err[$m]=$(why_failed "$work/cg.err"); continue
            fi
        fi
        local best="" r
        for _ in 1 2 3; do
            if ! r=$(run_mode "$m" GPUSHIM_MEMORY_LIMIT=$lim "$work/alloc_pairs" single "$single" 2>"$work/run.err"); then
                err[$m]=$(why_failed "$work/run.err"); break
            fi
            best=$(awk -v a="$r" -v b="$best" 'BEGIN { print (b == "" || a < b) ? a : b }')
        done
        [[ -n ${err[$m]:-} ]] && continue
        ns[$m]=$best
        best=0
        for _ in 1 2 3; do
            if ! r=$(run_mode "$m" GPUSHIM_MEMORY_LIMIT=$lim "$work/alloc_pairs" threads 8 "$n8" 2>"$work/run.err"); then
                err[$m]=$(why_failed "$work/run.err"); break
            fi
            ((r > best)) && best=$r
        done
        [[ -n ${err[$m]:-} ]] || rate[$m]=$best
    done
    echo "== cuMemAlloc_v2(4 KiB) + cuMemFree_v2 pairs, GPUSHIM_MEMORY_LIMIT=$lim, simulated 16 GiB device"
    ((have_cg)) || echo "   (valgrind not found: instruction counts skipped)"
    printf '%-12s %11s %9s %15s %17s %9s\n' mode "instr/pair" "added" "ns/pair 1 thr" "pairs/s 8 thr" "8 thr vs"
    printf '%-12s %11s %9s %15s %17s %9s\n' "" "callgrind" "by shim" "best of 3" "best of 3" "no shim"
    for m in "${modes[@]}"; do
        local why=${unavailable[$m]:-${err[$m]:-}}
        if [[ -n $why ]]; then printf '%-12s %s\n' "$(label "$m")" "$why"; continue; fi
        local i="-" a="-" q="-"
        if [[ -n ${ins[$m]:-} ]]; then
            i=$((ins[$m] / pairs))
            [[ $m != none && -n ${ins[none]:-} ]] && a=$(printf '%+d' $(((ins[$m] - ins[none]) / pairs)))
        fi
        [[ -n ${rate[none]:-} ]] && q=$(awk -v a="${rate[$m]}" -v b="${rate[none]}" 'BEGIN { printf "%.3f", a / b }')
        printf '%-12s %11s %9s %15s %17s %9s\n' "$(label "$m")" "$i" "$a" "${ns[$m]}" "${rate[$m]}" "$q"
    done
    echo "   ($pairs pairs under callgrind; $single pairs on one thread; 8 threads x $n8 pairs)"
}

kv() { sed -n "s/^$1=//p" "$work/trace.out"; }
pct() { awk -v v="$1" 'BEGIN { if (v == "") print "-"; else printf "%.1f%%", 100 * v }'; }
frac() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") print "-"; else printf "%.1f%%", 100 * a / b }'; }

fragmentation() {
    local limit=$((2 << 30)) t m
    echo "== fragmentation: GPUSHIM_MEMORY_LIMIT=2GiB, simulated 16 GiB device, seed $seed, $steps steps"
    echo "   sizes log-uniform 512 B..64 MiB (30% from 512 B..64 KiB, 5% pitched); the same requests in every mode"
    for t in $targets; do
        echo "-- live-set target $(pct "$t") of the limit"
        printf '%-20s %8s %8s %7s %7s %7s %9s %9s %9s %9s %9s %6s\n' mode "requests" "bytes" "<=1MiB" "<=10MiB" ">10MiB" \
            "peak live" "live at" "driver" "driver" "driver" "time"
        printf '%-20s %8s %8s %7s %7s %7s %9s %9s %9s %9s %9s %6s\n' "" "ok" "ok" "ok" "ok" "ok" \
            "/ limit" "1st fail" "peak" "MemAlloc" "AllocPitch" "s"
        for m in "${modes[@]}"; do
            local name out="$work/frag.out" rep="$work/frag.json" env=(GPUSHIM_MEMORY_LIMIT=$limit)
            name=$(label "$m")
            [[ $m == none ]] && { name="no shim (2 GiB dev)"; env=(GPUSIM_MEMORY=$limit); }
            if [[ -n ${unavailable[$m]:-} ]]; then printf '%-20s %s\n' "$name" "${unavailable[$m]}"; continue; fi
            rm -f "$rep"
            if ! run_mode "$m" "${env[@]}" GPUSIM_REPORT="$rep" "$work/fragmentation" "$limit" "$seed" "$steps" "$t" \
                >"$out" 2>"$work/frag.err"; then
                printf '%-20s %s\n' "$name" "$(why_failed "$work/frag.err")"; continue
            fi
            cp "$out" "$work/trace.out"
            call() { grep -o "\"$1\":[0-9]*" "$rep" 2>/dev/null | cut -d: -f2 | grep . || echo 0; }
            local first="-" peak
            [[ $(kv first_failure_step) != -1 ]] && first=$(pct "$(kv live_at_first_failure_fraction)")
            peak=$(grep -o '"peak":[0-9]*' "$rep" 2>/dev/null | head -1 | cut -d: -f2)
            printf '%-20s %8s %8s %7s %7s %7s %9s %9s %9s %9s %9s %6s\n' "$name" "$(pct "$(kv ok_fraction)")" \
                "$(pct "$(kv bytes_fraction)")" "$(pct "$(kv small.ok_fraction)")" "$(pct "$(kv medium.ok_fraction)")" \
                "$(pct "$(kv large.ok_fraction)")" "$(pct "$(kv peak_live_fraction)")" "$first" \
                "$(frac "$peak" "$limit")" "$(call cuMemAlloc_v2)" "$(call cuMemAllocPitch_v2)" "$(kv seconds)"
            if grep -q "not out of memory" "$work/frag.err"; then
                echo "   $name: $(grep -c "not out of memory" "$work/frag.err") allocations failed with another" \
                    "error than out of memory, first: $(grep -m1 "not out of memory" "$work/frag.err")"
            fi
        done
        [[ -f $work/trace.out ]] && echo "   (the trace: $(kv requests) allocation requests, $(kv pitched) of them pitched;" \
            "ideal peak $(pct "$(kv ideal_peak_fraction)") of the limit)"
        rm -f "$work/trace.out"
    done
}

placement() {
    local n=20000 row ins base=""
    echo "== placement log: cuLaunchKernel of a PTX kernel on the default stream, simulated device"
    if ! command -v valgrind >/dev/null; then echo "   (valgrind not found: skipped)"; return; fi
    printf '%-22s %12s %9s\n' "" "instr/launch" "added"
    for row in "no shim" "shim, log off" "shim, log on"; do
        local env=()
        case $row in
            "shim, log off") env=(LD_PRELOAD="$shim") ;;
            "shim, log on") env=(LD_PRELOAD="$shim" GPUSHIM_LOG_PLACEMENT=1 GPUSHIM_LOG=off) ;;
        esac
        if ! env "${env[@]}" valgrind --tool=callgrind --toggle-collect=run_launches \
            --callgrind-out-file="$work/cgl.out" "$work/launches" "$n" >/dev/null 2>"$work/cgl.err"; then
            printf '%-22s %s\n' "$row" "$(why_failed "$work/cgl.err")"; continue
        fi
        ins=$(grep -E '^summary:|^totals:' "$work/cgl.out" | head -1 | awk '{print $2}')
        [[ -z $base ]] && base=$ins
        printf '%-22s %12s %9s\n' "$row" $((ins / n)) "$(printf '%+d' $(((ins - base) / n)))"
    done
    echo "   ($n launches under callgrind, after 100 outside the measured function)"
}

# callgrind_total FILE: the instructions a whole-program callgrind run counted.
callgrind_total() { grep -E '^summary:|^totals:' "$1" | head -1 | awk '{print $2}'; }

load_cost() {
    echo "== load cost: /bin/true, whole program under callgrind"
    if ! command -v valgrind >/dev/null; then echo "   (valgrind not found: skipped)"; return; fi
    local base with
    valgrind --tool=callgrind --callgrind-out-file="$work/cgt0.out" /bin/true 2>/dev/null
    LD_PRELOAD="$shim" valgrind --tool=callgrind --callgrind-out-file="$work/cgt1.out" /bin/true 2>/dev/null
    base=$(callgrind_total "$work/cgt0.out") with=$(callgrind_total "$work/cgt1.out")
    printf '%-26s %12s %10s\n' "" instructions added
    printf '%-26s %12s %10s\n' "/bin/true" "$base" -
    printf '%-26s %12s %10s\n' "LD_PRELOAD=libgpushim.so" "$with" "$(printf '%+d' $((with - base)))"
    local dynamic relocs
    dynamic=$(readelf -d "$shim") relocs=$(readelf -r "$shim")
    echo "   libgpushim.so: $(stat -c %s "$shim") bytes on disk ($(grep -c NEEDED <<<"$dynamic") libraries needed," \
        "$(nm -D --defined-only "$shim" | wc -l) exported symbols, $(grep -c R_X86_64_RELATIVE <<<"$relocs") relative relocations,"
    echo "   $(awk '/R_X86_64_(GLOB_DAT|JUMP_SLOT|64) /{print $5}' <<<"$relocs" | sort -u | wc -l) symbols bound at load;" \
        "immediate binding: $(grep -qE 'BIND_NOW|FLAGS_1.*NOW' <<<"$dynamic" && echo yes || echo NO)," \
        "PT_GNU_RELRO: $(readelf -lW "$shim" | grep -q GNU_RELRO && echo yes || echo NO))"
}

startup() {
    echo "== start-up: a CUDA runtime program (cudart 12): cudaMalloc(1 MiB), cudaFree; whole program under callgrind"
    if ! command -v valgrind >/dev/null; then echo "   (valgrind not found: skipped)"; return; fi
    local row base="" ins env=()
    printf '%-28s %12s %10s\n' "" instructions added
    for row in "no shim" "gpushim, no limit" "gpushim, limit 8 GiB"; do
        case $row in
            "no shim") env=() ;;
            "gpushim, no limit") env=(LD_PRELOAD="$shim") ;;
            *) env=(LD_PRELOAD="$shim" GPUSHIM_MEMORY_LIMIT=8GiB) ;;
        esac
        if ! env "${env[@]}" GPUSHIM_STATE_DIR="$work/state" valgrind --tool=callgrind --callgrind-out-file="$work/cgs.out" \
            "$work/rt_startup" >/dev/null 2>"$work/cgs.err"; then
            printf '%-28s %s\n' "$row" "$(why_failed "$work/cgs.err")"; continue
        fi
        ins=$(callgrind_total "$work/cgs.out")
        if [[ -z $base ]]; then base=$ins; printf '%-28s %12s %10s\n' "$row" "$ins" -; continue; fi
        printf '%-28s %12s %10s\n' "$row" "$ins" "$(printf '%+d' $((ins - base)))"
    done
    # The steps, by name, in the build with symbols (the same code: LTO, one codegen unit).
    local prof="$target/profiling/libgpushim.so"
    [[ -f $prof ]] || { echo "   (no profiling build: steps skipped)"; return; }
    if ! env LD_PRELOAD="$prof" GPUSHIM_MEMORY_LIMIT=8GiB GPUSHIM_STATE_DIR="$work/state" valgrind --tool=callgrind \
        --compress-strings=no --compress-pos=no --callgrind-out-file="$work/cgp.out" "$work/rt_startup" >/dev/null 2>&1; then
        echo "   (the profiling build failed: steps skipped)"; return
    fi
    echo "-- the shim's steps, limit 8 GiB (inclusive instructions; the build with symbols)"
    printf '%-58s %10s %6s\n' step instructions calls
    python3 scripts/bench/steps.py "$work/cgp.out" \
        "settings~(environment,~config~file)=gpushim_common::settings::config::load::load" \
        "state~(budgets,~reserves,~live~map)=gpushim::state::State::empty" \
        "view~(GPUSHIM_VISIBLE_DEVICES)=gpushim::state::State::apply_view" \
        "shared~quota~(join)=gpushim::sharing::join::join_quota" \
        "opening~the~driver,~looking~its~functions~up=gpushim::state::State::load" \
        "after~cuInit~(view~check,~publishing)=gpushim::state::State::after_cuda_init" \
        "first~use~of~a~device~(limit,~registry)=gpushim::sharing::join::attach_device" \
        "cuGetProcAddress~substitutions=gpushim::hooks::intercept::substitute" \
        "the~whole~first~look-up~(all~of~start-up)=gpushim::hooks::intercept::hooked_lookup" |
        while read -r label n calls; do printf '%-58s %10s %6s\n' "${label//\~/ }" "$n" "$calls"; done
    echo "   (the rest of what the shim adds: loading it (see load cost) and the hooks' own work)"
}

hami() {
    local lib rows=("no shim" "gpushim passthrough" "HAMi-core") row
    echo "== side by side with HAMi-core: the same programs on the same simulated driver, limit 8 GiB"
    if ! lib=$(bash scripts/fetch-hami-core.sh 2>"$work/hami.err"); then
        echo "   HAMi-core: not available ($(tail -1 "$work/hami.err"))"; return
    fi
    echo "   (HAMi-core $lib: commit 8f3a89c, built as its build.sh builds it)"
    # side_env ROW: the environment of a row.
    side_env() {
        case $1 in
            "no shim") ;;
            "gpushim passthrough") echo LD_PRELOAD="$shim" GPUSHIM_MEMORY_MODE=passthrough GPUSHIM_MEMORY_LIMIT=8GiB GPUSHIM_STATE_DIR="$work/state" ;;
            HAMi-core) echo LD_PRELOAD="$lib" CUDA_REDIRECT="$lib" CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/hami.cache" ;;
        esac
    }
    local have_cg=1 have_strace=1
    command -v valgrind >/dev/null || have_cg=0
    command -v strace >/dev/null || have_strace=0
    declare -A ins=() sys=() ns=() rate=() err=() load=() start=()
    local n1=$((pairs / 10)) e r best
    for row in "${rows[@]}"; do
        read -r -a e <<<"$(side_env "$row")"
        rm -f "$work/hami.cache"
        if ((have_cg)); then
            if env "${e[@]}" valgrind --tool=callgrind --toggle-collect=run_pairs --callgrind-out-file="$work/cgh.out" \
                "$work/alloc_pairs_dlsym" callgrind "$n1" >/dev/null 2>"$work/cgh.err"; then
                ins[$row]=$(callgrind_total "$work/cgh.out")
            else
                err[$row]=$(why_failed "$work/cgh.err"); continue
            fi
            env "${e[@]}" valgrind --tool=callgrind --callgrind-out-file="$work/cgt.out" /bin/true 2>/dev/null &&
                load[$row]=$(callgrind_total "$work/cgt.out")
            env "${e[@]}" valgrind --tool=callgrind --callgrind-out-file="$work/cgs.out" "$work/rt_startup" >/dev/null 2>&1 &&
                start[$row]=$(callgrind_total "$work/cgs.out")
        fi
        if ((have_strace)); then
            local c1 c2
            env "${e[@]}" strace -f -c -o "$work/st1" "$work/alloc_pairs_dlsym" single 1000 >/dev/null 2>&1 &&
                env "${e[@]}" strace -f -c -o "$work/st2" "$work/alloc_pairs_dlsym" single 2000 >/dev/null 2>&1 &&
                c1=$(awk '/^100.00|total/ {print $4}' "$work/st1" | tail -1) c2=$(awk '/^100.00|total/ {print $4}' "$work/st2" | tail -1) &&
                sys[$row]=$(awk -v a="$c1" -v b="$c2" 'BEGIN { printf "%.1f", (b - a) / 1000 }')
        fi
        best=""
        for _ in 1 2 3; do
            r=$(env "${e[@]}" "$work/alloc_pairs_dlsym" single $((pairs * 10)) 2>/dev/null) || { err[$row]="the 1-thread run failed"; break; }
            best=$(awk -v a="$r" -v b="$best" 'BEGIN { print (b == "" || a < b) ? a : b }')
        done
        ns[$row]=$best
        best=0
        for _ in 1 2 3; do
            r=$(env "${e[@]}" "$work/alloc_pairs_dlsym" threads 8 $((pairs * 5)) 2>/dev/null) || { err[$row]="the 8-thread run failed"; break; }
            ((r > best)) && best=$r
        done
        rate[$row]=$best
    done
    printf '%-20s %10s %8s %9s %10s %12s %8s %12s %12s\n' "" "instr/pair" added "syscalls" "ns/pair" "pairs/s" "8 thr vs" "/bin/true" "start-up"
    printf '%-20s %10s %8s %9s %10s %12s %8s %12s %12s\n' "" callgrind "" "per pair" "1 thread" "8 threads" "no shim" "added" "added"
    for row in "${rows[@]}"; do
        if [[ -n ${err[$row]:-} ]]; then printf '%-20s %s\n' "$row" "${err[$row]}"; continue; fi
        local i=- a=- q=- l=- st=-
        [[ -n ${ins[$row]:-} ]] && i=$((ins[$row] / n1))
        [[ $row != "no shim" && -n ${ins[$row]:-} && -n ${ins["no shim"]:-} ]] && a=$(printf '%+d' $(((ins[$row] - ins["no shim"]) / n1)))
        [[ -n ${rate["no shim"]:-} && ${rate["no shim"]} != 0 ]] && q=$(awk -v a="${rate[$row]}" -v b="${rate["no shim"]}" 'BEGIN { printf "%.3f", a / b }')
        [[ $row != "no shim" && -n ${load[$row]:-} && -n ${load["no shim"]:-} ]] && l=$(printf '%+d' $((load[$row] - load["no shim"])))
        [[ $row != "no shim" && -n ${start[$row]:-} && -n ${start["no shim"]:-} ]] && st=$(printf '%+d' $((start[$row] - start["no shim"])))
        local sc=${sys[$row]:--}
        [[ $row != "no shim" && $sc != - && -n ${sys["no shim"]:-} ]] && sc=$(awk -v a="$sc" -v b="${sys["no shim"]}" 'BEGIN { printf "%+.1f", a - b }')
        printf '%-20s %10s %8s %9s %10s %12s %8s %12s %12s\n' "$row" "$i" "$a" "$sc" "${ns[$row]}" "${rate[$row]}" "$q" "$l" "$st"
    done
    echo "   (pairs through dlsym; $n1 under callgrind, $((pairs * 10)) on one thread, 8 threads x $((pairs * 5)); system calls:"
    echo "    strace -c of 2,000 pairs minus 1,000, per pair, added to no shim's; start-up: scripts/bench/rt_startup.c)"
    echo "   library size: libgpushim.so $(stat -c %s "$shim") bytes, HAMi-core libvgpu.so $(stat -c %s "$lib") bytes (as built: with debug information)"
}

compute() {
    local n=20000 row ins own base="" own_base=""
    echo "== compute limit (duty): cuLaunchKernel of a PTX kernel on the default stream, simulated device (kernels take no time: no launch waits)"
    if ! command -v valgrind >/dev/null; then echo "   (valgrind not found: skipped)"; return; fi
    printf '%-32s %12s %9s %12s\n' "" "instr/launch" "added" "in the shim"
    for row in "no shim" "shim, no limit" "shim, COMPUTE_LIMIT=100%" "shim, COMPUTE_LIMIT=90%"; do
        local env=()
        case $row in
            "shim, no limit") env=(LD_PRELOAD="$shim") ;;
            "shim, COMPUTE_LIMIT=100%") env=(LD_PRELOAD="$shim" GPUSHIM_COMPUTE_LIMIT=100%) ;;
            "shim, COMPUTE_LIMIT=90%") env=(LD_PRELOAD="$shim" GPUSHIM_COMPUTE_LIMIT=90% GPUSHIM_COMPUTE_MODE=duty) ;;
        esac
        if ! env "${env[@]}" valgrind --tool=callgrind --toggle-collect=run_launches \
            --callgrind-out-file="$work/cgc.out" "$work/launches" "$n" >/dev/null 2>"$work/cgc.err"; then
            printf '%-32s %s\n' "$row" "$(why_failed "$work/cgc.err")"; continue
        fi
        ins=$(grep -E '^summary:|^totals:' "$work/cgc.out" | head -1 | awk '{print $2}')
        own=$(callgrind_self_in "$work/cgc.out" libgpushim)
        [[ -z $base ]] && base=$ins
        printf '%-32s %12s %9s %12s\n' "$row" $((ins / n)) "$(printf '%+d' $(((ins - base) / n)))" $((own / n))
    done
    echo "   ($n launches under callgrind; \"added\" includes the driver's event calls the pacer makes"
    echo "    (two cuEventRecord, a cuEventQuery and cuEventElapsedTime per launch); \"in the shim\": the"
    echo "    instructions executed in libgpushim.so itself)"
}

# callgrind_self_in FILE OBJECT: the instructions a callgrind run executed in objects whose name
# contains OBJECT (self cost: each function's own lines, not what it called).
callgrind_self_in() {
    python3 - "$1" "$2" <<'PY'
import re, sys
names, ob, total, skip = {}, "", 0, False
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"(c?ob)=\((\d+)\)(?: (.*))?", line)
    if m:
        if m.group(3):
            names[m.group(2)] = m.group(3)
        if m.group(1) == "ob":
            ob = names.get(m.group(2), "")
        continue
    if line.startswith("calls="):
        skip = True
        continue
    if line[:1].isdigit() or line[:1] in "+-*":
        if skip:
            skip = False
            continue
        parts = line.split()
        if len(parts) >= 2 and sys.argv[2] in ob:
            total += int(parts[1])
print(total)
PY
}

# Each section when asked for alone, or all of them.
first=1
for section in overhead fragmentation placement compute load startup hami; do
    [[ -z $only || $only == "$section" ]] || continue
    ((first)) || echo
    first=0
    case $section in load) load_cost ;; *) $section ;; esac
done
echo "(bench.sh: $((SECONDS - started)) s)"
