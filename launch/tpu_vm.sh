#!/usr/bin/env bash
# Run wmrl on a Cloud TPU VM or pod slice: create or reuse the TPU VM, put the code on every
# worker, install requirements on every worker, run `python -m wmrl.main` on every worker.
#
# Every worker runs the same command; wmrl.main detects the pod slice (this script exports
# WMRL_TPU_POD=1 because GCE TPU VMs publish their worker list only through the metadata server)
# and calls jax.distributed.initialize(), which reads the topology from that metadata.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/tpu_vm.sh --name=NAME --zone=ZONE --config=CONFIG --workdir=gs://BUCKET/RUN [options]

Required:
  --name=NAME                TPU VM name (created if it does not exist, reused if it does)
  --zone=ZONE                e.g. us-west4-a
  --config=CONFIG            config file relative to the repo root, e.g. configs/bandit.py
  --workdir=DIR              run directory shared by all workers, normally gs://BUCKET/RUN

Options:
  --accelerator_type=TYPE    TPU type, e.g. v5litepod-16, v4-32, v5p-64, v6e-16 (default v5litepod-16)
  --runtime_version=VERSION  TPU software version (default from the accelerator family:
                             v2-alpha-tpuv5-lite for v5litepod, v2-alpha-tpuv5 for v5p,
                             v2-alpha-tpuv6e for v6e, tpu-ubuntu2204-base otherwise)
  --project=PROJECT          GCP project (default: gcloud's configured project)
  --spot                     create a Spot TPU VM
  --preemptible              create a preemptible TPU VM (older form of --spot)
  --repo_url=URL             clone URL on every worker (fresh clone of --branch)
  --branch=BRANCH            branch or tag for --repo_url (default main)
  --copy                     copy the local working tree instead (tarball, without .venv/.git/runs)
  --extra='FLAGS'            extra flags appended to `python -m wmrl.main`, e.g. '--config.num_steps=100';
                             they reach the workers' shell as written, so quote for that shell
  --dry_run                  print every command (prefixed '+ '), execute nothing
  -h, --help                 show this help

Exactly one of --repo_url and --copy is required.
Example:
  launch/tpu_vm.sh --name=wmrl-pod --zone=us-west4-a --accelerator_type=v5litepod-16 --spot \
    --copy --config=configs/bandit.py --workdir=gs://my-bucket/runs/bandit-1
EOF
}

die() {
  echo "tpu_vm.sh: error: $*" >&2
  echo "run 'launch/tpu_vm.sh --help' for the options" >&2
  exit 2
}

NAME="" ZONE="" CONFIG="" WORKDIR="" PROJECT="" EXTRA="" REPO_URL="" BRANCH="main"
ACCELERATOR_TYPE="v5litepod-16" RUNTIME_VERSION="" CAPACITY="" COPY=0 DRY_RUN=0

for arg in "$@"; do
  case "$arg" in
    --name=*) NAME="${arg#*=}" ;;
    --zone=*) ZONE="${arg#*=}" ;;
    --config=*) CONFIG="${arg#*=}" ;;
    --workdir=*) WORKDIR="${arg#*=}" ;;
    --accelerator_type=*) ACCELERATOR_TYPE="${arg#*=}" ;;
    --runtime_version=*) RUNTIME_VERSION="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;;
    --spot | --preemptible)
      [[ -z "$CAPACITY" || "$CAPACITY" == "$arg" ]] || die "--spot and --preemptible are exclusive"
      CAPACITY="$arg"
      ;;
    --repo_url=*) REPO_URL="${arg#*=}" ;;
    --branch=*) BRANCH="${arg#*=}" ;;
    --copy) COPY=1 ;;
    --extra=*) EXTRA="${arg#*=}" ;;
    --dry_run) DRY_RUN=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) die "unknown argument '$arg' (options take the form --name=VALUE)" ;;
  esac
done

missing=()
for pair in "name:$NAME" "zone:$ZONE" "config:$CONFIG" "workdir:$WORKDIR"; do
  [[ -n "${pair#*:}" ]] || missing+=("--${pair%%:*}")
done
((${#missing[@]} == 0)) || die "missing ${missing[*]}"
if ((COPY)) && [[ -n "$REPO_URL" ]]; then die "give either --repo_url or --copy, not both"; fi
if ((!COPY)) && [[ -z "$REPO_URL" ]]; then die "missing --repo_url=URL or --copy"; fi
[[ "$WORKDIR" == gs://* ]] ||
  echo "tpu_vm.sh: warning: --workdir=$WORKDIR is not gs://; each worker gets its own local copy" >&2

if [[ -z "$RUNTIME_VERSION" ]]; then
  case "$ACCELERATOR_TYPE" in
    v5litepod-* | v5e-*) RUNTIME_VERSION="v2-alpha-tpuv5-lite" ;;
    v5p-*) RUNTIME_VERSION="v2-alpha-tpuv5" ;;
    v6e-*) RUNTIME_VERSION="v2-alpha-tpuv6e" ;;
    *) RUNTIME_VERSION="tpu-ubuntu2204-base" ;;
  esac
fi

# Print one argument so that the printed line can be pasted back into a shell.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

run() {
  local line="+" a
  for a in "$@"; do line+=" $(quote "$a")"; done
  echo "$line"
  ((DRY_RUN)) || "$@"
}

SCOPE=(--zone="$ZONE")
[[ -z "$PROJECT" ]] || SCOPE+=(--project="$PROJECT")
TPU=(gcloud compute tpus tpu-vm)
REMOTE_DIR="wmrl"

# 1. Create the TPU VM unless it exists (describe fails when it does not).
DESCRIBE=("${TPU[@]}" describe "$NAME" "${SCOPE[@]}" --format='value(state)')
CREATE=("${TPU[@]}" create "$NAME" "${SCOPE[@]}" --accelerator-type="$ACCELERATOR_TYPE"
  --version="$RUNTIME_VERSION")
[[ -z "$CAPACITY" ]] || CREATE+=("$CAPACITY")
if ((DRY_RUN)); then
  run "${DESCRIBE[@]}"
  echo "# the create below runs only when the describe above finds no TPU VM named $NAME"
  run "${CREATE[@]}"
elif state="$("${DESCRIBE[@]}" 2>/dev/null)"; then
  echo "reusing TPU VM $NAME (state $state)"
else
  run "${CREATE[@]}"
fi

# 2. The code, on every worker.
ON_ALL=("${TPU[@]}" ssh "$NAME" "${SCOPE[@]}" --worker=all)
if ((COPY)); then
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  TARBALL="${TMPDIR:-/tmp}/wmrl-$NAME.tar.gz"
  run tar -C "$ROOT" --exclude=.venv --exclude=.git --exclude=runs --exclude=__pycache__ \
    -czf "$TARBALL" .
  run "${TPU[@]}" scp "$TARBALL" "$NAME:wmrl.tar.gz" "${SCOPE[@]}" --worker=all
  run "${ON_ALL[@]}" \
    --command="rm -rf $REMOTE_DIR && mkdir -p $REMOTE_DIR && tar -xzf wmrl.tar.gz -C $REMOTE_DIR"
else
  run "${ON_ALL[@]}" \
    --command="rm -rf $REMOTE_DIR && git clone --depth=1 --branch=$BRANCH $REPO_URL $REMOTE_DIR"
fi

# 3. Requirements on every worker; jax[tpu] brings the libtpu that matches the pinned jax, and
# requirements-gcs.txt the Cloud Storage clients of a gs:// workdir (docs/pods.md).
# The run starts from the repo root (`python3 -m wmrl.main`), so wmrl itself needs no install.
REQS="-r requirements.txt"
[[ "$WORKDIR" != gs://* ]] || REQS+=" -r requirements-gcs.txt"
run "${ON_ALL[@]}" \
  --command="cd $REMOTE_DIR && python3 -m pip install -q $REQS 'jax[tpu]>=0.10.2,<0.11'"

# 4. The run, on every worker at once.
MAIN="python3 -m wmrl.main --config=$CONFIG --workdir=$WORKDIR${EXTRA:+ $EXTRA}"
run "${ON_ALL[@]}" --command="cd $REMOTE_DIR && WMRL_TPU_POD=1 $MAIN"
