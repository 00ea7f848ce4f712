#!/usr/bin/env bash
# The package works when installed from its wheel, not only as an editable checkout (.ci/run runs this):
# build the wheel and the sdist, check that every file of src/maskattn is in the wheel, install the wheel into a
# fresh virtual environment outside the checkout and run from there `maskattn --version`, the README's main job,
# `maskattn list`, `maskattn demo`, every shipped preset's configuration, a refused preset name, and a few training
# steps of the `trec` preset when ../shared/data/trec is there.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python -m build --sdist --wheel --outdir "$work/dist" "$root" > "$work/build.log" 2>&1 \
  || { cat "$work/build.log"; exit 1; }
wheel=("$work"/dist/maskattn-*.whl)
python "$root/scripts/check_wheel.py" "${wheel[0]}"

python -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
pip install -q torch==2.13.0 > "$work/pip.log" 2>&1 || { cat "$work/pip.log"; exit 1; }
pip install -q "${wheel[0]}" > "$work/pip.log" 2>&1 || { cat "$work/pip.log"; exit 1; }
cd "$work"  # outside the checkout: everything below runs from the installed wheel

expected="$(python -c 'from importlib.metadata import version; print(version("maskattn"))')"
test "$(maskattn --version)" = "maskattn $expected"
python -c "import maskattn, sys; sys.exit(maskattn.__version__ != '$expected')"
python -c "import maskattn, pathlib; assert 'site-packages' in pathlib.Path(maskattn.__file__).parts"

maskattn train --out runs/default --no-progress > train.log  # the README's main job
maskattn list > /dev/null
maskattn demo --steps 20 > /dev/null
python - <<'PY'
from maskattn.train import list_presets, load_config, preset_path
presets = list_presets()
assert len(presets) >= 10, presets
for name in presets:
    load_config(preset_path(name))  # every shipped preset is there and valid
print(f"{len(presets)} presets load from the wheel")
PY
if maskattn train --preset no-such-preset > refused.log 2>&1; then
  echo "an unknown preset was accepted" >&2; exit 1
fi
grep -q "unknown preset 'no-such-preset'; presets: cr, " refused.log || { cat refused.log; exit 1; }
data="$root/../shared/data/trec"
if [ -d "$data" ]; then
  maskattn train --preset trec --data "$data" --out runs/trec --max-steps 3 --no-progress \
    --set train.eval_every=3 --set train.num_threads=1 > trec.log
  echo "the trec preset trained 3 steps on $data"
else
  echo "note: $data is not here; the preset training step was skipped"
fi
echo "wheel check passed ($(basename "${wheel[0]}"))"
