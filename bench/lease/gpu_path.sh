#!/usr/bin/env bash
# Issue 41's figures in one lease (docs/gpu_lease.md), parts in order of what matters, each cut at
# its own limit and all at DEADLINE seconds; everything is packed into $OUT/results.tar.gz at the
# end (the device tool brings back 8 files), beside $OUT/log.txt:
#   step_*.json   bench.pretrain_step, paper config, batch 256, bf16, STEPS timed steps, no warm-up
#                 (the whole window): eager, compiled (train.compile=true), compiled with CUDA
#                 graphs (compile_mode=reduce-overhead: one graph per visible length), both STDM
#                 modes; the compiled bernoulli run profiled (device time by kind of kernel); every
#                 run's share of the wall in the host's launch after its first step (is the device
#                 waiting on the host?)
#   exp_short_attention.json  compiled bernoulli, profiled, with the axial Time Decoder's 12- and
#                 30-token attention in batched matmuls instead of 64/128-row fused tiles
#                 (--short-attention 32): its attention time against step_compiled_bernoulli's
#   paper.txt     `python jobs/pretrain.py --config configs/paper.yaml` as a user runs it (devices
#                 and compile from auto; a cold inductor cache) on a synthetic corpus of RECORDS
#                 records for EPOCHS epochs: its device line and closing speed line with the
#                 start-up phases
#   tests.txt     tests/test_cuda_compile.py and the GPU share measurement (TESTS_K picks)
#   exp_static*.json  compiled and graphed with static shapes (no automatic dynamic)
#   paper_extra.txt   the job again with PAPER_EXTRA (default: 8 CPUs for the worker, so 8
#                 intra-op threads for the host side instead of Ray's 1)
#   sweep_*.txt   with SWEEP=1 and 200 s left: a 4-cell jobs/sweep_mask_rates.py, trials sharing
#                 the GPU (--gpus-per-trial auto) against one trial per GPU (measured on
#                 2026-11-27 (b): 2.4x the trials an hour)
# The lease of 2026-11-27 (b) ran this script's earlier form: docs/performance.md.
set -uo pipefail
START=$SECONDS
DEADLINE=${DEADLINE:-560}
exec > >(tee "$OUT/log.txt") 2>&1
R=/tmp/gpu-path; rm -rf $R; mkdir -p $R
source bench/lease/setup.sh
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-bench
stamp() { echo "== $1 at $((SECONDS - START)) s"; }
left() { local l=$((DEADLINE - (SECONDS - START))); (( l < $1 )) && echo "$l" || echo "$1"; }
part() {   # part LIMIT NAME COMMAND...: stdout to $R/NAME (a .txt: stderr too), skipped under 20 s left
    local limit; limit=$(left "$1"); local name=$2; shift 2
    if (( limit < 20 )); then echo "== $name skipped: ${limit} s left"; return; fi
    if [[ $name == *.txt ]]; then timeout "$limit" "$@" > "$R/$name" 2>&1; else timeout "$limit" "$@" > "$R/$name"; fi
    stamp "$name rc $?"
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
common=(-m bench.pretrain_step --device cuda --batch 256 --precisions bf16 --steps ${STEPS:-40} --warmup 0
        --in-process --variants core)
compiled=(--set train.compile=true)
graphs=(--set train.compile=true --set train.compile_mode=reduce-overhead)
part 70 step_eager.json python "${common[@]}" --modes bernoulli,exact --set train.compile=false
part 80 step_compiled_bernoulli.json python "${common[@]}" --modes bernoulli --profile 3 "${compiled[@]}"
part 60 step_compiled_exact.json python "${common[@]}" --modes exact "${compiled[@]}"
part 90 step_graphs.json python "${common[@]}" --modes bernoulli,exact "${graphs[@]}"
# The experiment with the most device time at stake (about half of the attention's 18 ms a step,
# docs/performance.md), before the user's path: the lease of 2026-11-27 (b) ended at 516 s.
part 80 exp_short_attention.json python "${common[@]}" --modes bernoulli --profile 3 "${compiled[@]}" --short-attention 32

# The user's path: a corpus built first (the figure is the run's, not the corpus build's), then the job.
job=(--config configs/paper.yaml --set data.synthetic_records=${RECORDS:-12288} --set data.cache_dir=/tmp/cache
     --set optim.epochs=${EPOCHS:-5} --set train.eval_every_epochs=0)
part 60 corpus.txt python -c "import sys; from coreecg.config import load_config; from coreecg.data.locate import synthetic_corpus
print(synthetic_corpus(load_config('configs/paper.yaml', sys.argv[1:])))" data.synthetic_records=${RECORDS:-12288} data.cache_dir=/tmp/cache
part 150 paper.txt env -u TORCHINDUCTOR_CACHE_DIR python jobs/pretrain.py "${job[@]}" --output /tmp/runs/paper
grep -hE "^device:|^speed:" "$R"/paper*.txt
cp /tmp/runs/paper/metrics.jsonl "$R/paper_metrics.jsonl" 2>/dev/null

part 150 tests.txt python -m pytest -q -p no:cacheprovider -rfE --tb=short tests/test_cuda_compile.py \
    tests/test_gpu_share.py -k "${TESTS_K:-cuda or gpu}"
grep -E "^(FAILED|ERROR)|passed|failed" "$R/tests.txt" | tail -n 12

part 70 exp_static.json python "${common[@]}" --modes bernoulli,exact "${compiled[@]}" --static-shapes
part 70 exp_static_graphs.json python "${common[@]}" --modes bernoulli,exact "${graphs[@]}" --static-shapes
part 120 paper_extra.txt python jobs/pretrain.py "${job[@]}" --output /tmp/runs/paper-extra \
    ${PAPER_EXTRA:---set train.cpus_per_worker=8}
grep -hE "^speed:" "$R"/paper_extra.txt 2>/dev/null

if [ -n "${SWEEP-}" ] && (( $(left 999) >= 200 )); then
    printf 'grid:\n  methods.core.masking.p_time: [0.4, 0.5]\n  methods.core.masking.p_lead: [0.1, 0.2]\n' > /tmp/grid4.yaml
    sweep=(--config configs/paper.yaml --space /tmp/grid4.yaml --set data.synthetic_records=2048 --set data.cache_dir=/tmp/cache
           --set optim.epochs=2 --set optim.warmup_epochs=0 --set train.compile=false --set data.probe_max_windows=200)
    part 150 sweep_shared.txt python jobs/sweep_mask_rates.py "${sweep[@]}" --gpus-per-trial auto --output /tmp/sw-shared
    part 150 sweep_whole.txt python jobs/sweep_mask_rates.py "${sweep[@]}" --gpus-per-trial 1 --output /tmp/sw-whole
fi
for f in "$R"/step_*.json "$R"/exp_*.json; do
    python -c "import json, sys; d = json.load(open(sys.argv[1])); [print(sys.argv[1].split('/')[-1], r) for r in d['summary']['runs']]
[print('error:', r['stdm_mode'], r['error'][-400:]) for r in d['results'] if 'error' in r]" "$f" 2>/dev/null || true
done
grep -hE "gpus per trial|run\(s\) in" "$R"/sweep_*.txt 2>/dev/null
tar -C "$R" -czf "$OUT/results.tar.gz" .
stamp done
