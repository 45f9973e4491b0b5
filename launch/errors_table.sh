#!/usr/bin/env bash
# docs/errors.md from the tests: runs the suites that try bad input and faults with
# TRAINER_ERROR_CASES set (every trainer run ending in exit 2 or 3, and every in-process UserError of
# the config tests, is recorded: tests/test_util.h), then launch/errors_table.py writes the table.
#   bash launch/errors_table.sh            # -> docs/errors.md
#   bash launch/errors_table.sh OUT.md
# About 5 minutes on two cores (the suites train tiny models to reach some of the faults).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
OUT=${1:-docs/errors.md}
[ -x "$BUILD/tests/unit_tests" ] || { echo "no $BUILD/tests/unit_tests: build first (bash launch/setup.sh)" >&2; exit 2; }
PYTHON=${PYTHON:-$HOME/.cache/llama-trainer/venv-torch-2.11.0/bin/python}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cases=$(mktemp)
trap 'rm -f "$cases"' EXIT
FILTER=${FILTER:-'Config*:Cli*:Prepare*:PrepareCommand*:PrepareWithTokenizer*:MemoryReport*:EstimateCommand*:Launcher*:Train.*:MemoryCheck*:DivergenceWatch*:Reference*:RunDir*:Galore*:TokenFile*:FusedStepFlags*:ActivationCheckpointingFlags*:Ledger*:Checkpoint*:Data*:StartupChecks*:RunHistory*:NewestCheckpoint*:Export*:InitFrom*:Ranks/InitFrom*:Cases/Refused*:TechniquesReport*:KeepLast*:StallWatchdog*:DamagedCheckpoint*:CommandLineNumbers*:CountProducts*:RunSettingsJson*:NothingOfTheUsers*:HandEditedManifest*:ResumeData*:NonFiniteLoss*:FolderLocks*:CheckedWrites*:TokenFileChanged*:MemoryReportErrors*:TrainerData*:TokenCorpus*:BadShard*:Damages/*:IdAboveThe*:TokenFileIds*:BatchSampler*:Formats/*:DataResume*:Evaluation*:Mixture*:RunLimits*:TensorBoard.ABad*:ParameterOffload.TheFlag*:MatmulPaddingFlag*:ResumeFlags*:InputPaths*:OffloadSchedule.TheFlags*:DelayedUpdate.TheFlag*:Locks/LinkedLock*:OutputsInsideCheckpoints*:ReportLock*:SlurmBatch*:UnfinishedPrepare*:StagingFolder*:DeepJson*:DamagedIndex*:ResumeSettings*:OpenFiles*:HybridFlags*:BackwardGatherFlags*:AcrossGroupsFlags*:StepTimeCommand.Profiling*:StepTimeCommand.ACollectiveTable*:ProfileCache.EveryBadUse*'}
TRAINER_ERROR_CASES=$cases "$BUILD/tests/unit_tests" --gtest_filter="$FILTER" --gtest_brief=1 > "$cases.log" 2>&1 || {
  echo "the tests failed: $cases.log" >&2; tail -n 30 "$cases.log" >&2; exit 1; }
rm -f "$cases.log"
"$PYTHON" launch/errors_table.py "$cases" "$OUT"
echo "[errors_table] $(grep -c '^| [0-9]' "$OUT") cases -> $OUT"
