#!/usr/bin/env bash
# On a lent GPU machine, from the repository root, with the kit of launch/gpu/pack.sh carried
# (device tool: carry ["gpu-kit"]). Nothing is built there: the kit's programs run against the image's
# torch (LibTorch, CUDA libraries, NCCL) and the kit's own Open MPI. Each stage ends well inside the
# device tool's 10 minutes and writes its results under $OUT (at most 8 files in all):
#   probe     the device, driver and versions; which libraries the kit's programs cannot find; MPI
#             starting 2 ranks; a 2-step run of the trainer; on a GPU, a --memory_snapshot read by
#             torch's memory_viz (launch/gpu/check_snapshot.py)                       -> probe.log, probe.json
#   tests     the CUDA unit tests (the loss's row blocks, the AdamW kernel) and the collective tests
#             on the GPU (NCCL at one rank, the staged MPI backend at 1, 2 and 4 ranks on one GPU)
#                                                                                  -> tests.log, tests.json
#   smoke     each feature's CUDA run against the same run on CPU, the async save's checkpoints
#             against the synchronous ones, resume, export and --init_from, the start-up check
#             refusing, each rank on its GPU (tests/gpu_paths_test.cpp)            -> smoke.log, smoke.json
#   sanitize  compute-sanitizer memcheck on a 2-rank sharded offload run and racecheck on one rank
#             (fp32, bf16 mixed, bf16 pure)
#                                                                                  -> sanitize.log, sanitize.json
#   bench     speed and memory (bench/gpu_bench.py's plan): llama_350m bf16 mixed and llama_1b bf16 pure,
#             our trainer against transformers + fused AdamW on the same GPU (tokens/s, MFU, phases,
#             peak memory); `trainer estimate` against the measured peak for llama_130m fp32, llama_350m,
#             llama_1b and llama_1b with --offload optimizer; offload's share of the throughput. Each
#             step under STEP_TIMEOUT (150 s), all of them under BENCH_BUDGET_S (420 s), then the
#             summary, whose figures bench.json holds under "bench"             -> bench.log, bench.json
#   launch/gpu/run.sh probe|tests|smoke|sanitize|bench
# Then, here: python3 launch/gpu/report.py FILES_AT > docs/gpu-results.md (with the command and device).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
KIT=$ROOT/${KIT_DIR:-gpu-kit}
OUT=${OUT:-$ROOT/gpu-out}
PYTHON=${TRAINER_PYTHON:-python3}
stage=${1:?usage: launch/gpu/run.sh probe|tests|smoke|sanitize|bench}
mkdir -p "$OUT"
[ -x "$KIT/bin/trainer" ] || { echo "no $KIT/bin/trainer: carry the kit (bash launch/gpu/pack.sh here)" >&2; exit 2; }

# LibTorch and CUDA's libraries from the image's torch; the kit's libraries first.
torch_libs=$("$PYTHON" - <<'EOF'
import glob, os, torch
folders = [os.path.join(os.path.dirname(torch.__file__), "lib")]
nvidia = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia")
folders += sorted(glob.glob(os.path.join(nvidia, "*", "lib"))) + sorted(glob.glob(os.path.join(nvidia, "cu*", "lib")))
print(":".join(folders))
EOF
) || { echo "the image's python ($PYTHON) has no torch" >&2; exit 2; }
mpi_usr=$KIT/mpi/usr
export LD_LIBRARY_PATH=$KIT/lib:$mpi_usr/lib/x86_64-linux-gnu:$mpi_usr/lib/x86_64-linux-gnu/openmpi/lib:$torch_libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# Open MPI and PMIx moved from /usr: their plugins, help files and mpirun are found from these.
export OPAL_PREFIX=$mpi_usr PMIX_INSTALL_PREFIX=$mpi_usr/lib/x86_64-linux-gnu/pmix2
export PATH=$KIT/bin:$mpi_usr/bin:$PATH:/usr/local/cuda/bin  # compute-sanitizer is in the toolkit
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_btl=self,vader,tcp
# The test binaries were built elsewhere: where the sources, the trainer, mpirun and python are here.
export TRAINER_TEST_SOURCE_DIR=$ROOT TRAINER_TEST_BINARY=$KIT/bin/trainer TRAINER_TEST_MPIEXEC=$mpi_usr/bin/mpirun
export TRAINER_TEST_PYTHON=$PYTHON OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

log=$OUT/$stage.log
summary=$OUT/$stage.json
: > "$log"
results=()
# SECONDS by which a step must start and end: STAGE_BUDGET_S from now (bench: BENCH_BUDGET_S, 420 s,
# below); empty: each step has STEP_TIMEOUT alone.
stage_deadline=""
[ -n "${STAGE_BUDGET_S:-}" ] && stage_deadline=$((SECONDS + STAGE_BUDGET_S))
# step NAME COMMAND...: runs it, its output to the log, its status and time to the summary. Its limit
# is STEP_TIMEOUT, or what is left of the stage's budget; with none left it is not started (exit 124).
step() {
  local name=$1; shift
  local started=$SECONDS limit=${STEP_TIMEOUT:-480} rc
  [ -n "$stage_deadline" ] && (( stage_deadline - SECONDS < limit )) && limit=$((stage_deadline - SECONDS))
  printf '\n### %s\n$ %s\n' "$name" "$*" >> "$log"
  if (( limit < 5 )); then
    echo "not started: the stage's budget is spent" >> "$log"
    rc=124
  else
    # The trainer takes SIGTERM as a preemption and ends its step first: KILL 20 s later if not.
    timeout -k 20 "$limit" bash -c "$*" < /dev/null >> "$log" 2>&1
    rc=$?
  fi
  results+=("$("$PYTHON" -c 'import json,sys; print(json.dumps({"name": sys.argv[1], "command": sys.argv[2], "rc": int(sys.argv[3]), "seconds": int(sys.argv[4])}))' "$name" "$*" "$rc" "$((SECONDS - started))")")
  printf '[%s] %s: exit %d in %d s\n' "$stage" "$name" "$rc" "$((SECONDS - started))"
}
write_summary() {
  local device
  device=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  { printf '{"stage": "%s", "date": "%s", "device": "%s", "commit": "%s", "steps": [' "$stage" \
      "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${device:-no GPU}" "$(head -1 "$KIT/MANIFEST" | awk '{print $NF}')"
    local first=1
    for r in "${results[@]}"; do [ $first -eq 1 ] || printf ', '; printf '%s' "$r"; first=0; done
    printf ']}\n'; } > "$summary"
  # bench: its figures (bench/gpu_bench.py summarize) go into the same file, under "bench".
  if [ "$stage" = bench ] && [ -f "$bench_work/results.json" ]; then
    "$PYTHON" -c 'import json, sys
summary = json.load(open(sys.argv[1]))
summary["bench"] = json.load(open(sys.argv[2]))
json.dump(summary, open(sys.argv[1], "w"), indent=1)' "$summary" "$bench_work/results.json"
  fi
}
bench_work=${BENCH_WORK:-/tmp/gpu-bench}  # bench's runs; only the summary's figures come back
trap write_summary EXIT

micro="--config configs/llama_micro.json --num_training_steps 2 --batch_size 2 --max_length 32 --eval_every 0"
gpu_flag=--device\ cuda
nvidia-smi -L >/dev/null 2>&1 || gpu_flag=--device\ cpu  # the dry run on CPU
case "$stage" in
  probe)
    step devices "nvidia-smi || echo 'no nvidia-smi'; $PYTHON -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())'"
    step missing_libraries "for f in $KIT/bin/*; do ldd \$f | grep 'not found' && echo \"  in \$f\"; done; echo checked"
    step mpi "mpirun -np 2 hostname && ompi_info --version | head -2"
    step trainer_help "trainer --help | head -3"
    step one_rank "rm -rf $OUT/probe_run; trainer $micro $gpu_flag --run_dir /tmp/probe_run && tail -2 /tmp/probe_run/metrics.jsonl"
    if [ "$gpu_flag" = "--device cuda" ]; then  # CUDA only: the allocator's history, read by torch's memory_viz
      step memory_snapshot "rm -rf /tmp/snapshot_run; trainer $micro $gpu_flag --memory_snapshot --run_dir /tmp/snapshot_run && $PYTHON launch/gpu/check_snapshot.py /tmp/snapshot_run/memory_snapshot.rank0.pickle"
    fi
    step two_ranks_staged "rm -rf /tmp/probe_run2; mpirun -np 2 trainer $micro $gpu_flag --communicator mpi --run_dir /tmp/probe_run2 && tail -1 /tmp/probe_run2/metrics.jsonl"
    # Issue 42's speed probe (bench/gpu_probe.py, about a minute on a GPU): the SDPA backend, llama_1b's
    # MLP GEMMs at 5461 and padded with cuBLAS's kernel names, a decoder layer each way, the fused
    # RMSNorm and the rotary forms against the eager ones. On CPU (the dry run) its tiny shapes.
    if [ "$gpu_flag" = "--device cuda" ]; then
      step speed_probe "$PYTHON bench/gpu_probe.py --out $OUT/gpu_probe.json"
    else
      step speed_probe "$PYTHON bench/gpu_probe.py --dry --out $OUT/gpu_probe.json"
    fi
    ;;
  tests)
    unit_filter='CrossEntropyMemory.*:*Cuda*:*CUDA*:StagedCommunicator.*:ResidentUnitsOff.*:SharedGpu.*'
    collectives_filter='*mpi_staged*:*nccl*:*single_cuda*:NcclStreams.*:MakeCommunicator.*'
    if [ "$gpu_flag" = "--device cpu" ]; then
      # The dry run: the binaries start in the kit's environment and run their GPU cases, which skip
      # here; their CPU cases (the staged communicator, the unit that gathers though resident) are the
      # main suite's already.
      unit_filter='*Cuda*:*CUDA*:SharedGpu.*'
      collectives_filter='*nccl*:*single_cuda*:NcclStreams.*'
    fi
    step unit_cuda "unit_tests --gtest_filter='$unit_filter' --gtest_brief=1"
    for ranks in 1 2 4; do
      step "collectives_np$ranks" "mpirun -np $ranks mpi_tests --gtest_filter='$collectives_filter' --gtest_brief=1"
    done
    ;;
  smoke)
    step gpu_paths "unit_tests --gtest_filter='${SMOKE_FILTER:-Features/OnGpu.*:OnGpuCheckpoints.*:OnGpuDevices.*:OnGpuMemoryCheck.*:OnGpuParameterOffload.*:OnGpuFusedOps.*:OnGpuOffloadSteps.*}' --gtest_brief=1"
    ;;
  sanitize)
    if ! command -v compute-sanitizer >/dev/null; then
      step compute_sanitizer "echo 'no compute-sanitizer on this machine'; exit 3"
    else
      step memcheck_two_ranks_offload "mpirun -np 2 compute-sanitizer --tool memcheck --error-exitcode 9 trainer $micro $gpu_flag --communicator mpi --dtype bfloat16 --precision pure --offload optimizer --run_dir /tmp/sanitize_run"
      step racecheck_one_rank "LLM_DEBUG_NO_RESIDENT_UNITS=1 compute-sanitizer --tool racecheck --error-exitcode 9 trainer $micro $gpu_flag --run_dir /tmp/sanitize_run1"
      # bf16 mixed: SDPA's flash kernel instead of the fp32 memory-efficient one, whose hazard the
      # first GPU run reported (docs/gpu-results.md); and our AdamW kernel over bf16-pure shards.
      step racecheck_bf16 "compute-sanitizer --tool racecheck --error-exitcode 9 trainer $micro $gpu_flag --dtype bfloat16 --precision mixed --run_dir /tmp/sanitize_run2"
      step racecheck_bf16_pure_adamw "compute-sanitizer --tool racecheck --error-exitcode 9 trainer $micro $gpu_flag --dtype bfloat16 --precision pure --run_dir /tmp/sanitize_run3"
    fi
    ;;
  bench)
    # The plan (bench/gpu_bench.py, where the runs and their sizes are written down): the device, every
    # estimate, then ours and pytorch's runs; on CPU (the dry run) the same with llama_micro.
    rm -rf "$bench_work" && mkdir -p "$bench_work"
    bench_device=${gpu_flag#--device }
    STEP_TIMEOUT=${STEP_TIMEOUT:-150}
    stage_deadline=$((SECONDS + ${BENCH_BUDGET_S:-${STAGE_BUDGET_S:-420}}))
    # The clocks and power beside the figures: before the plan and after it (a throttled card shows).
    step clocks_before "nvidia-smi -q -d CLOCK,POWER > $OUT/clocks_before.txt 2>&1 || echo 'no nvidia-smi' > $OUT/clocks_before.txt; head -30 $OUT/clocks_before.txt"
    step plan "$PYTHON bench/gpu_bench.py plan --device $bench_device --work $bench_work --python $PYTHON > $bench_work/plan.tsv && cut -f1 $bench_work/plan.tsv"
    # BENCH_ONLY (an extended regular expression over the steps' names) runs a part of the plan, e.g.
    # a second sample of the speed runs: BENCH_ONLY='^(device|ours_llama_350m|pytorch_llama_350m)'
    # summarize is told, and reports missing only the figures of the steps that ran.
    while IFS=$'\t' read -r name command; do
      [[ -z "${BENCH_ONLY:-}" || "$name" =~ ${BENCH_ONLY:-} ]] || continue
      step "$name" "$command"
    done < "$bench_work/plan.tsv"
    stage_deadline=""  # the summary runs whatever is left: it reads files, a few seconds
    step clocks_after "nvidia-smi -q -d CLOCK,POWER > $OUT/clocks_after.txt 2>&1 || echo 'no nvidia-smi' > $OUT/clocks_after.txt; head -30 $OUT/clocks_after.txt"
    step summarize "$PYTHON bench/gpu_bench.py summarize --device $bench_device --work $bench_work --out $bench_work/results.json --only '${BENCH_ONLY:-}'"
    ;;
  *) echo "unknown stage $stage: probe, tests, smoke, sanitize or bench" >&2; exit 2 ;;
esac
failed=0
for r in "${results[@]}"; do case "$r" in *'"rc": 0,'*) ;; *) failed=1 ;; esac; done
exit $failed
