#!/usr/bin/env bash
# The one command a GPU pod runs first: does the code work on CUDA, and how fast is a generation?
#
#   bash benchmarks/gpu_smoke.sh [OUT.md]        # figures to OUT.md (default gpu_smoke.md), tables as BENCHMARKS.md's
#
# 1. the gpu-marked tests;
# 2. paper-preset generations (benchmarks/memory_soak.py, the real trainer), eager and with runtime.cuda_graphs, TF32
#    (runtime.matmul_precision high) and float32, bf16 encoders off and on, torch.compile on: seconds a generation
#    and its phases;
# 3. default-preset generations on the GPU, eager, graphed, and graphed and compiled, and on this machine's CPU
#    cores, in the same call;
# 4. the update against the card's peaks (benchmarks/update_roofline.py --check-profiler), paper, eager, graphed,
#    and graphed and compiled, its kernels counted by the dispatcher and by the profiler;
# 5. one backtest fold (default preset, 40 generations, graphed), timed;
# 5b. each phase against the card's floor (benchmarks/generation_floor.py): the default preset graphed, graphed and
#    compiled (its kernels counted by the profiler: the compiled day's fused kernels), on this machine's CPU cores,
#    and the paper preset graphed and compiled;
# 6. a smoke run on cuda resumed with --device cpu for one more generation (it must say it is not bit for bit);
# 7. with GPU_SMOKE_SOAK_GENERATIONS > 0: a graphed paper soak of that many generations, judged by memory_soak.py;
# 8. with two or more GPUs (nvidia-smi -L): a paper run under torchrun with 2 processes and the same run with one,
#    their parameters compared by `main.py inspect --json` (params_sha256) and their speeds side by side.
#
# Without CUDA it prints one line and exits 2, writing nothing. It exits 1 when a check failed (the figures it has
# are still written, and the work folder with the logs is kept), else 0.
#
# Needs pytest: pip install -r requirements-dev.txt (its torch range accepts a CUDA image's own build).
# Environment: PYTHON (default python), GPU_SMOKE_GENERATIONS (generations per timing, default 5; the medians leave out
# the first and every generation that captured a CUDA graph: a graphed step warms up for two calls, then captures), GPU_SMOKE_SOAK_GENERATIONS (default 0: no soak), GPU_SMOKE_SECTIONS (some of "tests paper
# default roofline backtest resume soak sharded", run in the order given, for a call that fits a device's time;
# default all), GPU_SMOKE_WORK (folder for runs and logs, kept; default a temporary one, removed when every check
# passed),
# GPU_SMOKE_DRY_RUN=1 (print the commands, one a line, and run none; assumes 2 GPUs).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"
GENERATIONS="${GPU_SMOKE_GENERATIONS:-5}"
SOAK_GENERATIONS="${GPU_SMOKE_SOAK_GENERATIONS:-0}"
ALL_SECTIONS="tests paper default roofline floor backtest resume soak sharded"
SECTIONS="${GPU_SMOKE_SECTIONS:-$ALL_SECTIONS}"
SECTIONS="${SECTIONS//,/ }"
DRY_RUN="${GPU_SMOKE_DRY_RUN:-0}"
OUT="${1:-gpu_smoke.md}"
[[ "$OUT" == /* ]] || OUT="$PWD/$OUT"
cd "$REPO"

FAILED=0
REPORT=""

# Run a command with its output in the log $1; in a dry run, print it (shell-quoted) instead.
run() {
    local log="$1"
    shift
    if [[ "$DRY_RUN" == 1 ]]; then
        local line
        printf -v line '%q ' "$@"
        echo "${line% }"
        return 0
    fi
    echo "gpu_smoke: $*" >&2
    if "$@" >"$log" 2>&1; then
        return 0
    fi
    echo "gpu_smoke: failed, see $log:" >&2
    tail -n 20 "$log" >&2
    return 1
}

fail() {
    FAILED=1
    echo "gpu_smoke: FAILED: $*" >&2
}

add() {
    REPORT+="$*"$'\n'
}

# One markdown row of a run's metrics.jsonl, "| LABEL | figures | EXTRA... |": medians over the generations of a
# steady run (benchmarks/smoke_figures.py: in a graphed run, only those after its capture that captured nothing).
figures() {
    "$PYTHON" benchmarks/smoke_figures.py "$@"
}

# Append figures' row to ROWS (or a row that says they could not be read).
add_row() {
    local row
    if row="$(figures "$@")"; then
        ROWS+="$row"$'\n'
    else
        fail "the figures of $2"
        ROWS+="| $1 | unreadable |"$'\n'
    fi
}

params_sha256() {
    "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["params_sha256"])' "$1"
}

check_cuda() {
    if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
        echo "gpu_smoke.sh needs a CUDA device (torch.cuda.is_available() is false here); nothing was run" >&2
        exit 2
    fi
}

machine() {
    local gpu driver count
    gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" ||
        gpu="$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name())')"
    driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)" || driver="unknown"
    count="$(gpu_count)"
    add "## GPU smoke: $gpu"
    add ""
    add "**Machine:** $count × $gpu (driver $driver), $("$PYTHON" -c 'import platform, torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, Python {platform.python_version()}")'), \
$(nproc) CPU cores; $(date -u +%Y-%m-%d). From \`bash benchmarks/gpu_smoke.sh\`."
    add ""
}

gpu_count() {
    if [[ "$DRY_RUN" == 1 ]]; then
        echo 2
    else
        nvidia-smi -L | grep -c '^GPU' || true
    fi
}

gpu_tests() {
    local log="$WORK/logs/pytest-gpu.log" result
    if run "$log" "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider; then
        result="passed"
    else
        result="FAILED"
        fail "the gpu-marked tests"
    fi
    [[ "$DRY_RUN" == 1 ]] && return 0
    add "### The gpu-marked tests"
    add ""
    add "\`python -m pytest -q -m gpu\`: $result ($(tail -n 1 "$log"))"
    add ""
}

# One timing of memory_soak.py: LABEL, NAME, then its --set arguments.
timing() {
    local label="$1" name="$2"
    shift 2
    if run "$WORK/logs/$name.log" "$PYTHON" benchmarks/memory_soak.py --generations "$GENERATIONS" \
        --out "$WORK/timings/$name" "$@"; then
        [[ "$DRY_RUN" == 1 ]] || add_row "$label" "$WORK/timings/$name"
    else
        fail "the timing $name"
        ROWS+="| $label | failed |"$'\n'
    fi
}

COLUMNS="s / generation | rollout | validate | evolve | update | checkpoint (loop's wait) | checkpoint write | telemetry | env steps/s | CUDA reserved (max)"

paper_timings() {
    local matmul bf16 graphs compiled
    ROWS=""
    for setting in "high false false false" "high false true false" "highest false true false" \
        "high true true false" "high false true true"; do
        read -r matmul bf16 graphs compiled <<<"$setting"
        timing "$matmul | $bf16 | $graphs | $compiled" "paper-$matmul-bf16-$bf16-graphs-$graphs-compile-$compiled" \
            --preset paper --set runtime.device=cuda --set "runtime.matmul_precision=$matmul" \
            --set "model.bf16_encoder=$bf16" --set "runtime.cuda_graphs=$graphs" --set "runtime.torch_compile=$compiled"
    done
    [[ "$DRY_RUN" == 1 ]] && return 0
    add "### A paper generation: CUDA graphs, TF32, bf16 encoders and torch.compile"
    add ""
    add "\`python benchmarks/memory_soak.py --preset paper --generations $GENERATIONS --set runtime.matmul_precision=M"
    add "--set model.bf16_encoder=B --set runtime.cuda_graphs=G --set runtime.torch_compile=C\` on the bundled data;"
    add "seconds, the median of generations 2 to $GENERATIONS that captured no CUDA graph (a graphed step warms up for two"
    add "calls and captures in the third; a compiled run compiles in the first)."
    add ""
    add "| matmul precision | bf16 encoder | CUDA graphs | torch.compile | $COLUMNS |"
    add "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    REPORT+="$ROWS"
    add ""
}

default_timings() {
    ROWS=""
    timing "cuda | false | false" default-cuda-eager --set runtime.device=cuda --set runtime.cuda_graphs=false
    timing "cuda | true | false" default-cuda-graphs --set runtime.device=cuda --set runtime.cuda_graphs=true
    timing "cuda | true | true" default-cuda-graphs-compiled --set runtime.device=cuda --set runtime.cuda_graphs=true \
        --set runtime.torch_compile=true
    timing "cpu ($(nproc) cores) | n/a | false" default-cpu --set runtime.device=cpu
    [[ "$DRY_RUN" == 1 ]] && return 0
    add "### A default generation: the GPU against this machine's CPU"
    add ""
    add "\`python benchmarks/memory_soak.py --generations $GENERATIONS --set runtime.device=D --set runtime.cuda_graphs=G"
    add "--set runtime.torch_compile=C\` in one call; seconds, the median of generations 2 to $GENERATIONS that captured"
    add "no CUDA graph."
    add ""
    add "| device | CUDA graphs | torch.compile | $COLUMNS |"
    add "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    REPORT+="$ROWS"
    add ""
}

roofline() {
    local graphs compiled log lines=""
    for setting in "false false" "true false" "true true"; do
        read -r graphs compiled <<<"$setting"
        log="$WORK/logs/roofline-graphs-$graphs-compile-$compiled.log"
        if run "$log" "$PYTHON" benchmarks/update_roofline.py --preset paper --check-profiler \
            --set runtime.device=cuda --set "runtime.cuda_graphs=$graphs" --set "runtime.torch_compile=$compiled"; then
            [[ "$DRY_RUN" == 1 ]] || lines+="$(cat "$log")"$'\n\n'
        else
            fail "the update roofline with runtime.cuda_graphs=$graphs runtime.torch_compile=$compiled"
        fi
    done
    [[ "$DRY_RUN" == 1 ]] && return 0
    add "### The paper update against the card"
    add ""
    add "\`python benchmarks/update_roofline.py --preset paper --check-profiler --set runtime.device=cuda"
    add "--set runtime.cuda_graphs=G --set runtime.torch_compile=C\` (compiled, the profiler's kernel count is the one"
    add "that applies: the dispatcher does not see a compiled graph's fused kernels):"
    add ""
    add '```'
    REPORT+="$lines"
    add '```'
    add ""
}

floor() {
    local name log lines=""
    for setting in "default-graphs|--preset default --set runtime.device=cuda --check-profiler" \
        "default-compiled|--preset default --set runtime.device=cuda --set runtime.torch_compile=true" \
        "default-cpu|--preset default --set runtime.device=cpu" \
        "paper-compiled|--preset paper --set runtime.device=cuda --set runtime.torch_compile=true"; do
        name="${setting%%|*}"
        log="$WORK/logs/floor-$name.log"
        # shellcheck disable=SC2086 # the settings are words
        if run "$log" "$PYTHON" benchmarks/generation_floor.py ${setting#*|}; then
            [[ "$DRY_RUN" == 1 ]] || lines+="$name"$'\n'"$(cat "$log")"$'\n\n'
        else
            fail "the floor of $name"
        fi
    done
    [[ "$DRY_RUN" == 1 ]] && return 0
    add "### Each phase against the card's floor"
    add ""
    add "\`python benchmarks/generation_floor.py --preset P --set runtime.device=D [--set runtime.torch_compile=true]\`"
    add "(compiled, the profiler's kernel count is the one that applies; per day: rollout's and validation's launches"
    add "over their days):"
    add ""
    add '```'
    REPORT+="$lines"
    add '```'
    add ""
}

backtest_fold() {
    local log="$WORK/logs/backtest-fold.log" start seconds result
    start="$(date +%s.%N)"
    if run "$log" "$PYTHON" main.py backtest --folds 1 --seeds 0 --generations 40 --device cuda \
        --set runtime.cuda_graphs=true --checkpoint-uri "$WORK/backtest" --no-progress; then
        seconds="$("$PYTHON" -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$start" "$(date +%s.%N)")"
        result="$seconds s"
    else
        fail "the backtest fold"
        result="failed"
    fi
    [[ "$DRY_RUN" == 1 ]] && return 0
    add "### One backtest fold"
    add ""
    add "\`main.py backtest --folds 1 --seeds 0 --generations 40 --device cuda --set runtime.cuda_graphs=true\`"
    add "(default preset, the start-up included): $result."
    add ""
}

soak() {
    ((SOAK_GENERATIONS > 0)) || return 0
    local log="$WORK/logs/soak.log"
    if run "$log" "$PYTHON" benchmarks/memory_soak.py --preset paper --generations "$SOAK_GENERATIONS" \
        --set runtime.device=cuda --set runtime.cuda_graphs=true; then
        [[ "$DRY_RUN" == 1 ]] && return 0
        add "### A paper soak, graphed"
        add ""
        add "\`python benchmarks/memory_soak.py --preset paper --generations $SOAK_GENERATIONS --set runtime.device=cuda"
        add "--set runtime.cuda_graphs=true\`:"
        add ""
        add '```'
        REPORT+="$(grep -v '^gen ' "$log")"$'\n'
        add '```'
        add ""
        grep -q "flat, no findings" "$log" || fail "the paper soak's verdict"
    else
        fail "the paper soak"
    fi
}

resume_on_cpu() {
    local root="$WORK/resume" result
    local common=(--checkpoint-uri "$root" --run-name cuda-then-cpu --no-progress)
    if ! run "$WORK/logs/resume-cuda.log" "$PYTHON" main.py --preset smoke --device cuda --generations 2 "${common[@]}"; then
        fail "the smoke run on cuda"
        result="the run on cuda failed"
    elif ! run "$WORK/logs/resume-cpu.log" "$PYTHON" main.py --resume --device cpu --generations 3 "${common[@]}"; then
        fail "--resume --device cpu"
        result="the resume on the CPU failed"
    elif [[ "$DRY_RUN" == 1 ]]; then
        return 0
    elif [[ ! -f "$root/cuda-then-cpu/gen-000003/manifest.json" ]]; then
        fail "the resume on the CPU wrote no generation 3"
        result="FAILED: no generation 3"
    elif ! grep -q "not bit for bit" "$WORK/logs/resume-cpu.log"; then
        fail "the resume on the CPU did not say that the device changed"
        result="FAILED: generation 3 written, but no note of the device change"
    else
        result="generation 3 written on the CPU, with the line \"$(grep -m 1 'not bit for bit' "$WORK/logs/resume-cpu.log")\""
    fi
    [[ "$DRY_RUN" == 1 ]] && return 0
    add "### Resume across devices"
    add ""
    add "\`main.py --preset smoke --device cuda --generations 2\`, then \`--resume --device cpu --generations 3\`: $result"
    add ""
}

sharded() {
    local count root="$WORK/sharded" w sha sha1="" sha2="" verdict="not compared (a run failed)"
    count="$(gpu_count)"
    if ((count < 2)); then
        if [[ "$DRY_RUN" != 1 ]]; then
            add "### The population over 2 GPUs (torchrun)"
            add ""
            add "Not run: nvidia-smi lists $count GPU."
            add ""
        fi
        return 0
    fi
    local common=(--preset paper --generations "$GENERATIONS" --device cuda --checkpoint-uri "$root" --no-progress)
    ROWS=""
    for w in 1 2; do
        local launcher=("$PYTHON")
        ((w == 1)) || launcher+=(-m torch.distributed.run --standalone "--nproc_per_node=$w") # torchrun
        if run "$WORK/logs/sharded-w$w.log" "${launcher[@]}" main.py "${common[@]}" --run-name "w$w" &&
            run "$WORK/logs/inspect-w$w.json" "$PYTHON" main.py inspect "$root/w$w" --json; then
            [[ "$DRY_RUN" == 1 ]] && continue
            sha="$(params_sha256 "$WORK/logs/inspect-w$w.json")" || sha=""
            if ((w == 1)); then sha1="$sha"; else sha2="$sha"; fi
            add_row "$w" "$root/w$w" "\`${sha:0:16}\`"
        else
            fail "the paper run with $w process(es)"
            ROWS+="| $w | failed |"$'\n'
        fi
    done
    [[ "$DRY_RUN" == 1 ]] && return 0
    if [[ -n "$sha1" && -n "$sha2" ]]; then
        if [[ "$sha1" == "$sha2" ]]; then verdict="equal, bit for bit"; else verdict="DIFFERENT"; fi
    fi
    add "### The population over 2 GPUs (torchrun)"
    add ""
    add "\`torchrun --standalone --nproc_per_node=2 main.py --preset paper --generations $GENERATIONS --device cuda\`"
    add "against the same with one process; seconds, the median of generations 2 to $GENERATIONS. Parameters after"
    add "generation $GENERATIONS (\`params_sha256\` of \`main.py inspect --json\`, its first 16 digits below): $verdict."
    add ""
    add "| W | s / generation | rollout | validate | evolve | update | checkpoint (loop's wait) | checkpoint write | telemetry | env steps/s | CUDA reserved (max, rank 0) | params_sha256 |"
    add "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    REPORT+="$ROWS"
    add ""
}

for section in $SECTIONS; do
    if [[ " $ALL_SECTIONS " != *" $section "* ]]; then
        echo "gpu_smoke.sh: unknown section $section in GPU_SMOKE_SECTIONS (sections: $ALL_SECTIONS)" >&2
        exit 2
    fi
done

if [[ "$DRY_RUN" == 1 ]]; then
    WORK="${GPU_SMOKE_WORK:-gpu-smoke-work}"
else
    check_cuda
    if [[ -n "${GPU_SMOKE_WORK:-}" ]]; then
        WORK="$GPU_SMOKE_WORK"
        [[ "$WORK" == /* ]] || WORK="$OLDPWD/$WORK" # given from where the script was started
        KEEP_WORK=1
    else
        WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-smoke.XXXXXX")"
        KEEP_WORK=0
    fi
    mkdir -p "$WORK/logs" "$WORK/timings"
    machine
fi

for section in $SECTIONS; do
    case "$section" in
    tests) gpu_tests ;;
    paper) paper_timings ;;
    default) default_timings ;;
    roofline) roofline ;;
    floor) floor ;;
    backtest) backtest_fold ;;
    resume) resume_on_cpu ;;
    soak) soak ;;
    sharded) sharded ;;
    esac
done

[[ "$DRY_RUN" == 1 ]] && exit 0
printf '%s' "$REPORT" >"$OUT"
echo "gpu_smoke: figures in $OUT" >&2
if ((FAILED)); then
    echo "gpu_smoke: some checks failed; runs and logs are in $WORK" >&2
    exit 1
fi
((KEEP_WORK)) || rm -rf "$WORK"
