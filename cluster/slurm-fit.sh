#!/bin/bash
#SBATCH --job-name=dkha-fit
#SBATCH --cpus-per-task=2
#SBATCH --mem=8G
#SBATCH --time=08:00:00
# The coordinator job: starts worker jobs through dask-jobqueue, runs the fit, resubmittable.
# usage: sbatch cluster/slurm-fit.sh STORE RUN_DIR [extra dkha fit options]
set -euo pipefail
STORE=$1; RUN=$2; shift 2
SCHED="$RUN.scheduler.json"
python "$(dirname "$0")/dkha-jobqueue.py" --system slurm --jobs "${DKHA_JOBS:-8}" --scheduler-file "$SCHED" &
CLUSTER=$!
trap 'kill $CLUSTER' EXIT
while [ ! -f "$SCHED" ]; do sleep 2; done
RESUME=""
[ -d "$RUN/checkpoints" ] && RESUME="--resume"
set +e
dkha fit "$STORE" -o "$RUN" --scheduler-file "$SCHED" --checkpoint-every 1 $RESUME "$@"
rc=$?
set -e
if [ $rc -eq 75 ]; then   # interrupted (time limit, lost cluster): resubmit to resume
  sbatch "$0" "$STORE" "$RUN" "$@"
fi
exit $rc
