#!/usr/bin/env bash
# On the GPU machine: install the carried wheels offline, run every part of the GPU suite, one JSON.
#
#   launch/gpu_suite.sh WHEELS ARTEFACTS OUT_DIR [-- EXTRA wmrl.benchmarks.gpu_suite FLAGS]
#   launch/gpu_suite.sh .gpu/wheels .gpu/artefacts "$OUT"
#
# WHEELS from `python -m wmrl.tools.gpu_wheels`, ARTEFACTS from
# `python -m wmrl.tools.prepare_gpu_artefacts` (docs/gpu.md); OUT_DIR gets gpu_suite.json.
# Python is $PYTHON, else python3. --dry_run prints the command instead of running it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN=0
POSITIONAL=()
EXTRA=()
while (($#)); do
  case "$1" in
    --dry_run) DRY_RUN=1 ;;
    -h | --help)
      sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    --)
      shift
      EXTRA=("$@")
      break
      ;;
    -*)
      echo "gpu_suite.sh: error: unknown option '$1' (put gpu_suite flags after --)" >&2
      exit 2
      ;;
    *) POSITIONAL+=("$1") ;;
  esac
  shift
done
((${#POSITIONAL[@]} == 3)) || {
  echo "gpu_suite.sh: error: expected WHEELS ARTEFACTS OUT_DIR, got '${POSITIONAL[*]:-}'" >&2
  exit 2
}
# Absolute, since the command runs from the repository root.
WHEELS="$(realpath -m "${POSITIONAL[0]}")"
ARTEFACTS="$(realpath -m "${POSITIONAL[1]}")"
OUT_DIR="$(realpath -m "${POSITIONAL[2]}")"
PY="${PYTHON:-python3}"

CMD=("$PY" -m wmrl.benchmarks.gpu_suite --wheels="$WHEELS" --artefacts="$ARTEFACTS"
  --out_dir="$OUT_DIR" "${EXTRA[@]}")
echo "+ cd $ROOT && ${CMD[*]}"
((DRY_RUN)) && exit 0
cd "$ROOT"
export PYTHONUNBUFFERED=1
exec "${CMD[@]}"
