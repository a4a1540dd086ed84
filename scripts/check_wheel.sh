#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh venv, and check that `osmosis init`
# finds its templates as package data: for every template, init a project outside the source
# tree, then run `osmosis validate`, `osmosis test` on its dataset, and the project's own pytest.
#
# Environment:
#   PYTHON     interpreter for the fresh venv (default: python3.11, else python3)
#   BUILD_PY   interpreter that builds the wheel (default: .venv/bin/python if present)
#   DEPS_FROM  offline mode: a venv whose site-packages provide the dependencies (e.g. .venv);
#              without it, the wheel's dependencies and pytest come from the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
BUILD_PY="${BUILD_PY:-}"
if [ -z "$BUILD_PY" ]; then
  if [ -x .venv/bin/python ]; then BUILD_PY=.venv/bin/python; else BUILD_PY="$PYTHON"; fi
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "== building the wheel"
if "$BUILD_PY" -c "import hatchling" >/dev/null 2>&1; then
  "$BUILD_PY" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$WORK/dist" .
else
  "$BUILD_PY" -m pip wheel --quiet --no-deps --wheel-dir "$WORK/dist" .
fi
WHEEL="$(ls "$WORK"/dist/osmosis_rollout-*.whl)"
echo "   $(basename "$WHEEL")"

echo "== installing it into a fresh venv"
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
if [ -n "${DEPS_FROM:-}" ]; then
  DEPS_SITE="$("$DEPS_FROM/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  VENV_SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # Appended after the venv's own site-packages, so the installed wheel wins over any
  # editable install there (whose .pth files are not processed from a plain path entry).
  echo "$DEPS_SITE" > "$VENV_SITE/zz_osmosis_deps.pth"
  "$VPY" -m pip install --quiet --no-index --no-deps "$WHEEL"
else
  "$VPY" -m pip install --quiet "$WHEEL" pytest
fi

echo "== the package and its templates come from the wheel"
"$VPY" - "$ROOT" <<'EOF'
import sys
from pathlib import Path

import osmosis_rollout
from osmosis_rollout.scaffold import default_templates_dir, list_templates

root = Path(sys.argv[1]).resolve()
package = Path(osmosis_rollout.__file__).resolve().parent
templates = default_templates_dir().resolve()
assert root not in package.parents, f"osmosis_rollout was imported from the source tree: {package}"
assert templates.parent == package, f"templates not found as package data: {templates}"
static = package / "view" / "static"
for name in ("index.html", "view.js", "view.css"):
    assert (static / name).is_file(), f"osmosis view's {name} is not in the wheel"
print(f"   {package}")
print(f"   templates: {', '.join(t.name for t in list_templates())}")
EOF

# Run a command quietly; on failure, show what it printed and stop.
quietly() {
  "$@" >"$WORK/step.log" 2>&1 || { cat "$WORK/step.log"; echo "FAILED: $*" >&2; exit 1; }
}

mkdir "$WORK/projects"
TEMPLATES="$("$VPY" -c 'from osmosis_rollout.scaffold import list_templates as l; print(*[t.name for t in l()])')"
for template in $TEMPLATES; do
  echo "== template $template"
  cd "$WORK/projects"
  quietly "$WORK/venv/bin/osmosis" init "demo-$template" --template "$template"
  cd "demo-$template"
  target="$("$VPY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["tool"]["osmosis"]["agent"])')"
  echo "   osmosis validate $target"
  quietly "$WORK/venv/bin/osmosis" validate "$target"
  echo "   osmosis test $target --dataset dataset.jsonl"
  quietly "$WORK/venv/bin/osmosis" test "$target" --dataset dataset.jsonl
  echo "   python -m pytest"
  quietly "$VPY" -m pytest -q -p no:cacheprovider
done
cd "$ROOT"
echo "== the wheel works: every template passes validate, test and its own tests"
