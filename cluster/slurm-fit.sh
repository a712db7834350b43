#!/bin/bash
#SBATCH --job-name=dkha-fit
#SBATCH --cpus-per-task=2
#SBATCH --mem=8G
#SBATCH --time=08:00:00
#SBATCH --signal=B:TERM@300
# The coordinator job: starts worker jobs through dask-jobqueue and runs the fit. Five minutes
# before the time limit (--signal) SLURM sends SIGTERM, which goes on to the fit: it writes a
# checkpoint and exits with 75, and the job resubmits itself, at most DKHA_MAX_RESUBMITS times
# (default 10; DKHA_RESUBMITS counts them). The resubmitted job continues the run with
# `dkha fit STORE -o RUN_DIR --resume`, which reads the run's settings from its checkpoint.
# Every fit checkpoints by itself (the default fit's Krylov products, the dense path's settings;
# --checkpoint-every N for a KHA fit to survive a hard kill): nothing here changes the algorithm.
# usage: sbatch cluster/slurm-fit.sh STORE RUN_DIR [extra dkha fit options]
set -euo pipefail
STORE=$1; RUN=$2; shift 2
RESUBMITS=${DKHA_RESUBMITS:-0}
MAX_RESUBMITS=${DKHA_MAX_RESUBMITS:-10}
SCHED="$RUN.scheduler.json"
python "$(dirname "$0")/dkha-jobqueue.py" --system slurm --jobs "${DKHA_JOBS:-8}" --scheduler-file "$SCHED" &
CLUSTER=$!
trap 'kill $CLUSTER' EXIT
while [ ! -f "$SCHED" ]; do sleep 2; done
RESUME=()
[ -d "$RUN/checkpoints" ] && RESUME=(--resume)
set +e
FIT=""
trap 'STOPPING=1; [ -n "$FIT" ] && kill -TERM $FIT' TERM
dkha fit "$STORE" -o "$RUN" --scheduler-file "$SCHED" ${RESUME[@]+"${RESUME[@]}"} "$@" &
FIT=$!
[ -n "${STOPPING:-}" ] && kill -TERM $FIT   # the signal came before the fit had started
wait $FIT
rc=$?
if [ -n "${STOPPING:-}" ] && [ $rc -gt 128 ]; then   # wait was cut short by the signal:
  wait $FIT                                          # the fit's own status (75 once it has
  again=$?                                           # checkpointed); 127: that was it
  [ $again -ne 127 ] && rc=$again
fi
set -e
if [ $rc -eq 75 ]; then   # stopped (time limit) or lost the cluster: resumable
  if [ "$RESUBMITS" -lt "$MAX_RESUBMITS" ]; then
    DKHA_RESUBMITS=$((RESUBMITS + 1)) sbatch --export=ALL "$0" "$STORE" "$RUN" "$@"
  else
    echo "slurm-fit.sh: $RUN stopped and resubmitted $RESUBMITS times (DKHA_MAX_RESUBMITS);" \
         "not resubmitted again: sbatch $0 $STORE $RUN to continue it" >&2
  fi
fi
exit $rc
