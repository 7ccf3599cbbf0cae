#!/usr/bin/env bash
# The prepared GPU check (issue 13): torch CUDA <-> jax CUDA bf16 routes, bridged functions,
# the probe, NumPy's DLPack registry and timings, in one command of a few minutes.
#
#   tools/device_check.sh               on the GPU machine: results to $OUT
#   tools/device_check.sh --dry-run --out DIR
#                                       the same tests on CPU tensors (CI runs this)
#
# It uses the machine's own Python ($PYTHON, else python3; the dry run prefers .venv) with this
# tree on PYTHONPATH: nothing is installed, nothing is fetched. It writes to the output folder:
#   device-junit.xml  pytest's JUnit report
#   device-check.json every check's outcome and what it recorded (tests/device/conftest.py)
#   device-check.md   the summary (tools/device_summary.py)
#   device-check.log  pytest's output
# and exits 0 only when every expected check ran, passed and recorded what it found.
set -u

here=$(cd "$(dirname "$0")/.." && pwd)
dry=0
out="${OUT:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=1 ;;
        --out) [ $# -ge 2 ] || { echo "device_check.sh: --out needs a folder" >&2; exit 2; }; out="$2"; shift ;;
        --out=*) out="${1#--out=}" ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "device_check.sh: unknown argument '$1' (use --dry-run, --out DIR)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$out" ]; then
    echo "device_check.sh: no output folder: pass --out DIR (on the device machine \$OUT is used)" >&2
    exit 2
fi
mkdir -p "$out" && out=$(cd "$out" && pwd)

if [ -z "${PYTHON:-}" ]; then
    if [ "$dry" = 1 ] && [ -x "$here/.venv/bin/python" ]; then PYTHON="$here/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
if [ "$dry" = 1 ]; then export BF16BRIDGE_DEVICE=cpu; else export BF16BRIDGE_DEVICE=cuda; fi
export BF16BRIDGE_DEVICE_OUT="$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # jax would take 75% of the GPU that torch shares
export PYTHONUNBUFFERED=1
export PYTHONDONTWRITEBYTECODE=1

cd "$here" || exit 2
rm -f "$out/device-check.json" "$out/device-check.md" "$out/device-junit.xml"
# the tree under test is this one, not a copy installed elsewhere
if ! "$PYTHON" -c "import os, sys, bf16bridge as b; r = os.path.realpath
sys.exit(not r(b.__file__).startswith(r(sys.argv[1]) + os.sep))" "$here"; then
    echo "device_check.sh: $PYTHON does not import bf16bridge from $here" >&2
    exit 2
fi
# Each test file runs in a process of its own, so a crash (a driver, a framework) loses that file's
# checks, not the whole run; all of them share one time limit. Warnings: ours stay errors (as in the
# normal run); a framework's own warning is reported, not fatal.
junit=$(mktemp -d)
trap 'rm -rf "$junit"' EXIT
: >"$out/device-check.log"
statuses=()
deadline=$((SECONDS + ${DEVICE_CHECK_TIMEOUT:-300}))
for file in tests/device/test_*.py; do
    name=$(basename "$file" .py)
    left=$((deadline - SECONDS))
    if [ "$left" -lt 15 ]; then
        echo "== $file: not started, the time limit is spent" >>"$out/device-check.log"
        statuses+=("$name=124")
        continue
    fi
    echo "== $file" >>"$out/device-check.log"
    timeout -k 10 "$left" "$PYTHON" -m pytest -q -p no:cacheprovider "$file" \
        -W default -W "error::bf16bridge.Bf16BridgeWarning" \
        --junitxml="$junit/$name.xml" -o junit_family=xunit1 >>"$out/device-check.log" 2>&1
    statuses+=("$name=$?")
done
grep -E "^(==|FAILED|ERROR)|passed|failed" "$out/device-check.log"
"$PYTHON" tools/device_summary.py "$out" --junit-from "$junit" --status "${statuses[@]}"
