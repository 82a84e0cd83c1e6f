# Sourced by the scripts/setup_*_venv.sh scripts: the prologue every engine venv shares.
#
# venv_begin VENV STAMP_NAME SCRIPT: sets ROOT, VENV, PY, STAMP and RECIPE (a hash of the
#   calling script, this file and pyproject.toml, so a change to any of them rebuilds);
#   returns 0 when the venv is already built from this recipe (the caller exits).
# venv_create: makes the venv, pins torch to the local CPU wheel (every later install is
#   constrained to it, so pip can never swap in a CUDA build), defines pip_install, installs
#   torch and checks that it is the CPU build. Sets START.
# venv_done: writes the stamp.

venv_begin() {
  ROOT=$(cd "$(dirname "$3")/.." && pwd)
  VENV=$1
  PY=$VENV/bin/python
  STAMP=$VENV/.radixlink-$2-stamp
  RECIPE=$(cat "$3" "$ROOT/scripts/venv_common.sh" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)
  [[ -x $PY && -f $STAMP && $(cat "$STAMP") == "$RECIPE" ]]
}

venv_create() {
  START=$SECONDS
  [[ -x $PY ]] || python3 -m venv "$VENV"
  rm -f "$STAMP"
  PIN=$VENV/torch-pin.txt
  # NOTE: the local CPU wheel; a looser pin lets pip resolve a CUDA build from the index.
  echo "torch==2.13.0+cpu" > "$PIN"
  pip_install() { "$PY" -m pip install -q --disable-pip-version-check -c "$PIN" "$@"; }
  pip_install --upgrade pip
  "$PY" -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
  "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.endswith('+cpu') else 1)" \
    || { echo "torch in $VENV is not the CPU build" >&2; exit 1; }
}

venv_done() {
  echo "$RECIPE" > "$STAMP"
}
