#!/usr/bin/env bash
# N CPU processes of one JAX run on this machine, joined through explicit coordinator flags.
#
#   launch/local_multiprocess.sh --num_processes=2 --config=C --workdir=DIR [options]
#
# Each process gets --coordinator_address=127.0.0.1:PORT --num_processes=N --process_id=i, runs
# on the CPU platform with --devices_per_process fake devices (JAX's CPU collectives, gloo, carry
# the cross-process traffic), and logs to WORKDIR_LOGS/process_<i>.log. The script waits for all
# of them; if one fails, the others are stopped and the script exits non-zero.
set -euo pipefail

usage() {
  cat <<'HELP'
Usage: launch/local_multiprocess.sh --config=CONFIG --workdir=DIR [options]
  --num_processes=N          processes to start (default 2)
  --devices_per_process=D    fake CPU devices per process (default 1)
  --port=PORT                coordinator port on 127.0.0.1 (default 12355)
  --logdir=DIR               per-process logs (default DIR.logs next to the workdir)
  --extra='FLAGS'            extra flags appended to `python -m wmrl.main`, split on spaces
  --dry_run                  print the commands; start nothing
  -h, --help                 show this help
Python: $PYTHON, else .venv/bin/python when present, else python3.
HELP
}

die() {
  echo "local_multiprocess.sh: error: $*" >&2
  exit 2
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG="" WORKDIR="" EXTRA="" LOGDIR="" DRY_RUN=0 NUM=2 DEVICES=1 PORT=12355
for arg in "$@"; do
  case "$arg" in
    --config=*) CONFIG="${arg#*=}" ;;
    --workdir=*) WORKDIR="${arg#*=}" ;;
    --num_processes=*) NUM="${arg#*=}" ;;
    --devices_per_process=*) DEVICES="${arg#*=}" ;;
    --port=*) PORT="${arg#*=}" ;;
    --logdir=*) LOGDIR="${arg#*=}" ;;
    --extra=*) EXTRA="${arg#*=}" ;;
    --dry_run) DRY_RUN=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) die "unknown argument '$arg'" ;;
  esac
done
missing=()
[[ -n "$CONFIG" ]] || missing+=(--config)
[[ -n "$WORKDIR" ]] || missing+=(--workdir)
((${#missing[@]} == 0)) || die "missing ${missing[*]}"
[[ "$NUM" =~ ^[1-9][0-9]*$ ]] || die "--num_processes must be a positive integer, got '$NUM'"
[[ "$DEVICES" =~ ^[1-9][0-9]*$ ]] || die "--devices_per_process must be a positive integer"
[[ "$PORT" =~ ^[0-9]+$ ]] || die "--port must be a number, got '$PORT'"
LOGDIR="${LOGDIR:-${WORKDIR%/}.logs}"

if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PY="$ROOT/.venv/bin/python"
else
  PY=python3
fi
read -r -a EXTRA_ARGS <<<"$EXTRA"
ENV=(JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count="$DEVICES")

command_for() { # sets CMD to process $1's command line
  CMD=(env "${ENV[@]}" "$PY" -m wmrl.main --config="$CONFIG" --workdir="$WORKDIR"
    --coordinator_address=127.0.0.1:"$PORT" --num_processes="$NUM" --process_id="$1"
    "${EXTRA_ARGS[@]}")
}
for ((i = 0; i < NUM; i++)); do
  command_for "$i"
  echo "+ ${CMD[*]} > $LOGDIR/process_$i.log 2>&1 &"
done
((DRY_RUN)) && exit 0

cd "$ROOT"
mkdir -p "$LOGDIR"
pids=()
for ((i = 0; i < NUM; i++)); do
  command_for "$i"
  "${CMD[@]}" >"$LOGDIR/process_$i.log" 2>&1 &
  pids+=($!)
done
# Poll rather than `wait -n`: a failure must stop the others at once instead of leaving them
# waiting for a peer that is gone, and `wait -n` misses children that ended before it is called.
declare -A index_of
for ((i = 0; i < NUM; i++)); do index_of[${pids[$i]}]=$i; done
status=0
while ((${#index_of[@]})); do
  for pid in "${!index_of[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    wait "$pid" && code=0 || code=$?
    i="${index_of[$pid]}"
    unset "index_of[$pid]"
    if ((code != 0)); then
      echo "process $i failed (exit $code); see $LOGDIR/process_$i.log" >&2
      if ((status == 0)); then
        for other in "${!index_of[@]}"; do kill "$other" 2>/dev/null || true; done
      fi
      status=1
    fi
  done
  ((${#index_of[@]} == 0)) || sleep 0.5
done
exit "$status"
