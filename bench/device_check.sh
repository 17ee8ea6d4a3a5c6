#!/usr/bin/env bash
# The one-GPU check from the repository alone (issue 43 item 6): one command, one JSON.
#
#   bash bench/device_check.sh [OUT_DIR]        (OUT_DIR default: $OUT, else ./device-check-out)
#
# Runs, each under its own bound (seconds, wall clock, enforced with `timeout -k 5`):
#   INSTALL_S=45         pip install --no-build-isolation --no-deps -e .  (no package index is used);
#                        if that fails (no setuptools, read-only site-packages), a plain-checkout shim:
#                        PYTHONPATH to a folder whose accelpact/ links the repository's folders as
#                        pyproject.toml's [tool.setuptools] package-dir maps them (accelpact.bench = bench/...)
#   GPU_CHECK_S=160      python -m accelpact.bench.gpu_check --timeout 150
#   CONFORMANCE_S=275    python -m accelpact.bench.gpu_conformance --subset quick --timeout 240
#                        (its preflight, then pytest; past 240 s pytest gets SIGINT, 30 s later SIGKILL)
# Together 480 s (8 minutes): the bounds are the variables below; tests/test_device_check.py sums them.
#
# Writes OUT_DIR/device_check.json: {"ok", "skipped"?, "bounds_s", "install", "gpu_check", "gpu_conformance"},
# each command's entry with its exit code, wall time, bound and its own last-line JSON; logs beside it.
# Exit codes: 0 every command passed; 1 a command failed or ran past its bound; 0 with "ok": null and
# "skipped" when this machine has no CUDA device or no torch (checked before anything is installed, so
# the skip costs a few seconds and changes nothing); 2 usage error.
set -u

INSTALL_S=45
GPU_CHECK_S=160
GPU_CHECK_INNER_S=150
CONFORMANCE_S=275
CONFORMANCE_INNER_S=240
TOTAL_LIMIT_S=480

if [ "$#" -gt 1 ]; then
    echo "usage: bash bench/device_check.sh [OUT_DIR]" >&2
    exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-${OUT:-$ROOT/device-check-out}}"
mkdir -p "$OUT_DIR" || { echo "device_check: cannot create $OUT_DIR" >&2; exit 2; }
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
JSON="$OUT_DIR/device_check.json"
PY="${PYTHON:-python}"
cd "$ROOT"

# the report, written by python (json escaping) from the KEY=file pairs collected below
write_report() {
    "$PY" - "$JSON" "$@" <<'PYEOF'
import json, sys
path, pairs = sys.argv[1], sys.argv[2:]
report = {}
for pair in pairs:
    key, _, value = pair.partition("=")
    if key.endswith("@file"):
        key = key[:-5]
        try:
            with open(value) as f:
                lines = [x for x in f.read().splitlines() if x.strip()]
            value = json.loads(lines[-1]) if lines else None
        except (OSError, ValueError) as exc:
            value = {"unreadable": f"{value}: {exc}"}
    elif key.endswith("@json"):
        key, value = key[:-5], json.loads(value)
    node = report
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
with open(path, "w") as f:
    json.dump(report, f, indent=1, default=str)
print(json.dumps(report, default=str))
PYEOF
}

BOUNDS="{\"install\": $INSTALL_S, \"gpu_check\": $GPU_CHECK_S, \"gpu_conformance\": $CONFORMANCE_S, \"total\": $((INSTALL_S + GPU_CHECK_S + CONFORMANCE_S)), \"limit\": $TOTAL_LIMIT_S}"

# 1. anything to run on?  Before the install: a CPU machine skips in seconds and changes nothing.
PROBE="$OUT_DIR/probe.txt"
timeout -k 5 60 "$PY" -c '
import sys
try:
    import torch
except Exception as exc:
    print(f"no torch importable ({exc}): the device check needs a CUDA build of torch"); sys.exit(0)
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
print("gpu" if n >= 1 else f"no CUDA device on this machine (torch {torch.__version__}): the device check needs one GPU")
' >"$PROBE" 2>&1
PROBED="$(tail -n 1 "$PROBE")"
if [ "$PROBED" != "gpu" ]; then
    write_report "ok@json=null" "skipped=$PROBED" "bounds_s@json=$BOUNDS" >/dev/null
    echo "device_check: skipped: $PROBED ($JSON)"
    exit 0
fi

# 2. the checkout, importable as accelpact.*, without the package index
T0=$(date +%s)
INSTALL_LOG="$OUT_DIR/install.log"
HOW="pip"
if [ "${ACCELPACT_DEVICE_CHECK_INSTALL:-1}" = "1" ]; then
    timeout -k 5 "$INSTALL_S" "$PY" -m pip install --no-build-isolation --no-deps --no-index -e . >"$INSTALL_LOG" 2>&1
    INSTALL_RC=$?
else
    echo "install skipped (ACCELPACT_DEVICE_CHECK_INSTALL=0)" >"$INSTALL_LOG"
    INSTALL_RC=0
    HOW="preinstalled"
fi
if [ "$INSTALL_RC" -ne 0 ] || ! "$PY" -c "import accelpact.bench.gpu_check" >>"$INSTALL_LOG" 2>&1; then
    # a plain checkout: accelpact/ links the folders that package-dir maps (pyproject.toml)
    SHIM="$OUT_DIR/shim"
    rm -rf "$SHIM"
    "$PY" - "$ROOT" "$SHIM" >>"$INSTALL_LOG" 2>&1 <<'PYEOF'
import os, re, sys
root, shim = sys.argv[1], sys.argv[2]
text = open(os.path.join(root, "pyproject.toml")).read()
line = next(x for x in text.splitlines() if x.strip().startswith("package-dir"))
mapping = dict(re.findall(r'"([\w.]+)"\s*=\s*"([\w./-]+)"', line))
pkg = os.path.join(shim, "accelpact")
os.makedirs(pkg)
for name in os.listdir(os.path.join(root, mapping["accelpact"])):
    if name != "__pycache__":
        os.symlink(os.path.join(root, mapping["accelpact"], name), os.path.join(pkg, name))
for dotted, folder in mapping.items():
    parts = dotted.split(".")
    if len(parts) == 2 and not os.path.exists(os.path.join(pkg, parts[1])):
        os.symlink(os.path.join(root, folder), os.path.join(pkg, parts[1]))
print(f"shim: {shim} ({len(mapping)} package-dir entries)")
PYEOF
    export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
    HOW="shim"
    if ! "$PY" -c "import accelpact.bench.gpu_check" >>"$INSTALL_LOG" 2>&1; then
        write_report "ok@json=false" "bounds_s@json=$BOUNDS" "install.how=$HOW" "install.rc@json=$INSTALL_RC" \
            "install.log=$INSTALL_LOG" "explain=accelpact.bench.gpu_check cannot be imported (see install.log: a missing dependency?)" >/dev/null
        echo "device_check: FAILED: the checkout cannot be imported ($JSON)"
        exit 1
    fi
fi
INSTALL_WALL=$(( $(date +%s) - T0 ))

# 3. the one-GPU check
T1=$(date +%s)
timeout -k 5 "$GPU_CHECK_S" "$PY" -m accelpact.bench.gpu_check --timeout "$GPU_CHECK_INNER_S" --out "$OUT_DIR/gpu_check" \
    >"$OUT_DIR/gpu_check.out" 2>"$OUT_DIR/gpu_check.err"
CHECK_RC=$?
CHECK_WALL=$(( $(date +%s) - T1 ))

# 4. the conformance quick subset, every rank on the one GPU
T2=$(date +%s)
timeout -k 5 "$CONFORMANCE_S" "$PY" -m accelpact.bench.gpu_conformance --subset quick --timeout "$CONFORMANCE_INNER_S" \
    --out "$OUT_DIR/gpu_conformance" >"$OUT_DIR/gpu_conformance.out" 2>"$OUT_DIR/gpu_conformance.err"
CONF_RC=$?
CONF_WALL=$(( $(date +%s) - T2 ))

OK=false
if [ "$CHECK_RC" -eq 0 ] && [ "$CONF_RC" -eq 0 ]; then OK=true; fi
write_report "ok@json=$OK" "bounds_s@json=$BOUNDS" \
    "install.how=$HOW" "install.rc@json=$INSTALL_RC" "install.wall_s@json=$INSTALL_WALL" "install.log=$INSTALL_LOG" \
    "gpu_check.rc@json=$CHECK_RC" "gpu_check.wall_s@json=$CHECK_WALL" "gpu_check.timed_out@json=$([ "$CHECK_RC" -ge 124 ] && echo true || echo false)" \
    "gpu_check.result@file=$OUT_DIR/gpu_check.out" \
    "gpu_conformance.rc@json=$CONF_RC" "gpu_conformance.wall_s@json=$CONF_WALL" "gpu_conformance.timed_out@json=$([ "$CONF_RC" -ge 124 ] && echo true || echo false)" \
    "gpu_conformance.result@file=$OUT_DIR/gpu_conformance.out" >/dev/null
echo "device_check: ok=$OK gpu_check rc=$CHECK_RC (${CHECK_WALL}s) gpu_conformance rc=$CONF_RC (${CONF_WALL}s) ($JSON)"
[ "$OK" = true ] && exit 0 || exit 1
