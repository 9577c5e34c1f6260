#!/usr/bin/env bash
# Laptop / single-host run, the same as `make run CONFIG=... WORKDIR=...` without the venv setup.
#
#   launch/local.sh [CONFIG [WORKDIR]] [-- EXTRA wmrl.main FLAGS]
#   launch/local.sh configs/bandit.py runs/try1 -- --config.num_steps=200
#
# CONFIG defaults to configs/bandit.py, WORKDIR to runs/<config name>-<timestamp>. Python is
# $PYTHON, else .venv/bin/python when `make setup` made one, else python3. --dry_run prints the
# command instead of running it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN=0
POSITIONAL=()
EXTRA=()
while (($#)); do
  case "$1" in
    --dry_run) DRY_RUN=1 ;;
    -h | --help)
      sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    --)
      shift
      EXTRA=("$@")
      break
      ;;
    -*)
      echo "local.sh: error: unknown option '$1' (put wmrl.main flags after --)" >&2
      exit 2
      ;;
    *) POSITIONAL+=("$1") ;;
  esac
  shift
done
((${#POSITIONAL[@]} <= 2)) || {
  echo "local.sh: error: expected at most CONFIG and WORKDIR, got ${POSITIONAL[*]}" >&2
  exit 2
}

CONFIG="${POSITIONAL[0]:-configs/bandit.py}"
NAME="$(basename "${CONFIG%%:*}" .py)"
WORKDIR="${POSITIONAL[1]:-runs/$NAME-$(date +%Y%m%d-%H%M%S)}"
if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PY="$ROOT/.venv/bin/python"
else
  PY=python3
fi

CMD=("$PY" -m wmrl.main --config="$CONFIG" --workdir="$WORKDIR" "${EXTRA[@]}")
echo "+ cd $ROOT && ${CMD[*]}"
((DRY_RUN)) && exit 0
cd "$ROOT"
exec "${CMD[@]}"
