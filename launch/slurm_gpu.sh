#!/usr/bin/env bash
# Multi-node GPU run under SLURM: one task per node, each task drives all of its node's GPUs.
#
# One process per node is JAX's recommended layout on GPU: a process sees every local GPU, and
# the cross-node collectives run over NCCL. The coordinator is process 0 on the allocation's first
# host (first line of `scontrol show hostnames`), and every task gets explicit
# --coordinator_address/--num_processes/--process_id flags (process id = SLURM_PROCID).
#
# Three ways to call it:
#   sbatch [--nodes=N --gpus-per-node=G ...] launch/slurm_gpu.sh --config=C --workdir=DIR
#   bash launch/slurm_gpu.sh --nodes=N --gpus_per_node=G --config=C --workdir=DIR   (submits)
#   bash launch/slurm_gpu.sh --dry_run --nodes=2 --config=C --workdir=DIR   (prints, runs nothing)
#
#SBATCH --job-name=wmrl
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/slurm_gpu.sh --config=CONFIG --workdir=DIR [options]

Required:
  --config=CONFIG          config file relative to the repo root, e.g. configs/bandit.py
  --workdir=DIR            run directory on a file system every node sees (or gs://...)

Options (used when submitting or dry-running; inside a job the allocation decides):
  --nodes=N                number of nodes, one process each (default 2)
  --gpus_per_node=G        GPUs per node (default 8)
  --time=HH:MM:SS          wall-clock limit passed to sbatch
  --partition=NAME         partition passed to sbatch
  --nodelist=LIST          dry run only: the fake allocation (default node[001-00N])
  --port=PORT              coordinator port (default $WMRL_COORDINATOR_PORT or 12355)
  --extra='FLAGS'          extra flags appended to `python -m wmrl.main`, split on spaces
  --dry_run                print the sbatch, scontrol and srun commands; execute nothing
  -h, --help               show this help

Python: $PYTHON if set, else `python` on PATH (activate the environment before submitting;
sbatch passes the environment on to the job).
EOF
}

die() {
  echo "slurm_gpu.sh: error: $*" >&2
  exit 2
}

CONFIG="" WORKDIR="" EXTRA="" TIME="" PARTITION="" NODELIST="" DRY_RUN=0
NODES=2 GPUS_PER_NODE=8 PORT="${WMRL_COORDINATOR_PORT:-12355}"
for arg in "$@"; do
  case "$arg" in
    --config=*) CONFIG="${arg#*=}" ;;
    --workdir=*) WORKDIR="${arg#*=}" ;;
    --nodes=*) NODES="${arg#*=}" ;;
    --gpus_per_node=*) GPUS_PER_NODE="${arg#*=}" ;;
    --time=*) TIME="${arg#*=}" ;;
    --partition=*) PARTITION="${arg#*=}" ;;
    --nodelist=*) NODELIST="${arg#*=}" ;;
    --port=*) PORT="${arg#*=}" ;;
    --extra=*) EXTRA="${arg#*=}" ;;
    --dry_run) DRY_RUN=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) die "unknown argument '$arg' (options take the form --config=VALUE)" ;;
  esac
done
missing=()
[[ -n "$CONFIG" ]] || missing+=(--config)
[[ -n "$WORKDIR" ]] || missing+=(--workdir)
((${#missing[@]} == 0)) || die "missing ${missing[*]}"
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer, got '$NODES'"
[[ "$GPUS_PER_NODE" =~ ^[1-9][0-9]*$ ]] || die "--gpus_per_node must be a positive integer"
[[ "$PORT" =~ ^[0-9]+$ ]] || die "--port must be a number, got '$PORT'"

quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

show() {
  local line="+" a
  for a in "$@"; do line+=" $(quote "$a")"; done
  echo "$line"
}

# First host of a nodelist without scontrol (dry run only): handles `gpu5,x`, `gpu[07-09,11],x`
# and one bracket group with a suffix such as `n[008-010]-ib`.
first_host_offline() {
  local re='^([^],[]*)(\[([0-9]+)[^]]*\]([^],[]*))?'
  [[ "$1" =~ $re ]] || die "cannot read nodelist '$1'"
  echo "${BASH_REMATCH[1]}${BASH_REMATCH[3]}${BASH_REMATCH[4]}"
}

read -r -a EXTRA_ARGS <<<"$EXTRA"
PY="${PYTHON:-python}"

srun_command() { # $1 coordinator, $2 number of processes
  # bash -c reads SLURM_PROCID inside each task; the other arguments pass through "$@" unchanged.
  SRUN=(srun --ntasks-per-node=1 --kill-on-bad-exit=1
    bash -c 'exec "$0" -m wmrl.main "$@" --process_id="$SLURM_PROCID"' "$PY"
    --config="$CONFIG" --workdir="$WORKDIR" --coordinator_address="$1" --num_processes="$2"
    "${EXTRA_ARGS[@]}")
}

if [[ -n "${SLURM_JOB_ID:-}" && $DRY_RUN == 0 ]]; then
  # Inside the allocation: this is the batch script.
  # The whole list is read (not `| head -n1`): under pipefail, head closing the pipe early would
  # kill scontrol with SIGPIPE and fail the job on large allocations.
  mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
  ((${#HOSTS[@]})) || die "scontrol found no hosts in SLURM_JOB_NODELIST='$SLURM_JOB_NODELIST'"
  COORDINATOR="${HOSTS[0]}:$PORT"
  NUM_PROCESSES="${SLURM_NTASKS:-$SLURM_JOB_NUM_NODES}"
  echo "wmrl: job $SLURM_JOB_ID, $NUM_PROCESSES processes, coordinator $COORDINATOR"
  srun_command "$COORDINATOR" "$NUM_PROCESSES"
  show "${SRUN[@]}"
  exec "${SRUN[@]}"
fi

# Submitting: the job starts in the repo root so that `python -m wmrl.main` finds the package
# (when calling sbatch yourself, submit from the repo root).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SBATCH=(sbatch --nodes="$NODES" --gpus-per-node="$GPUS_PER_NODE" --ntasks-per-node=1
  --chdir="$ROOT")
[[ -z "$TIME" ]] || SBATCH+=(--time="$TIME")
[[ -z "$PARTITION" ]] || SBATCH+=(--partition="$PARTITION")
SBATCH+=("$ROOT/launch/slurm_gpu.sh" --config="$CONFIG" --workdir="$WORKDIR" --port="$PORT")
[[ -z "$EXTRA" ]] || SBATCH+=(--extra="$EXTRA")

if ((DRY_RUN)); then
  if ((NODES == 1)); then FAKE="node001"; else FAKE="node[001-$(printf '%03d' "$NODES")]"; fi
  NODELIST="${NODELIST:-$FAKE}"
  show "${SBATCH[@]}"
  echo "# inside the job (fake allocation SLURM_JOB_NODELIST=$NODELIST):"
  echo "+ scontrol show hostnames $(quote "$NODELIST")  # first host: the coordinator"
  srun_command "$(first_host_offline "$NODELIST"):$PORT" "$NODES"
  show "${SRUN[@]}"
  exit 0
fi
show "${SBATCH[@]}"
exec "${SBATCH[@]}"
