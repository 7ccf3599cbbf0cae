#!/usr/bin/env bash
# The Arm check (issue 30): bf16bridge on an emulated arm64 (aarch64) CPU, from scratch, repeatable.
#
#   tools/arm_check.sh OUT [setup|run|tests|summary|all]  (default all; as root; about 20 minutes the
#                                                   first time, 2.8 GB of wheels; the root is kept)
#
# setup: an arm64 Debian bookworm root (debootstrap + qemu-user-static through binfmt_misc) and a
#        Python 3.11 venv in it with the aarch64 wheels of the pinned frameworks (constraints.txt).
# run:   copies this working tree in (tracked and untracked files, not the venvs) and, under each
#        emulated CPU model (QEMU_CPU), records what the CPU shows (auxv HWCAP2, /proc/cpuinfo), the
#        probe (JSON and its stderr), each framework's decisions, the compute trials and the
#        allocation alignments, a 65,536-pattern bf16 round trip, and the probe and bits tests; then
#        writes OUT/arm-check.json and, unless ARM_NO_SAVE=1, the results folder's arm-check.json
#        (docs/probe.md's "Emulated Arm" block is generated from it: python -m bf16bridge.capabilities.summary arm;
#        tests/capabilities/test_probe_docs.py checks the two agree).
# tests: only the pytest runs. The summary covers SUMMARY_CPUS (default: ARM_CPUS), so a rerun of one
#        CPU's tests can keep the others in it.
# summary: only the summary, from what OUT holds.
#
# env: ARM_ROOT (default /tmp/arm/root), ARM_WHEELS (/tmp/arm/whl), ARM_CPUS ("cortex-a72 neoverse-n1
#      max"), ARM_TESTS (default below), ARM_TEST_TIMEOUT (seconds per pytest run, 1800), ARM_SKIP_TESTS=1.
# CI does not run it (it takes too long). Emulated timings mean nothing: the summary keeps what the
# probe read and decided, never a time.
set -euo pipefail

OUT=${1:?usage: tools/arm_check.sh OUT [setup|run|tests|summary|all]}
WHAT=${2:-all}
HERE=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${ARM_ROOT:-/tmp/arm/root}
WHEELS=${ARM_WHEELS:-/tmp/arm/whl}
CPUS=${ARM_CPUS:-cortex-a72 neoverse-n1 max}
TESTS=${ARM_TESTS:-tests/core/test_bits.py tests/capabilities/test_probe.py tests/capabilities/test_cpu_paths.py tests/capabilities/test_compute_trials.py}
TEST_TIMEOUT=${ARM_TEST_TIMEOUT:-1800}
VENV=/opt/venv          # inside the root
SRC=/opt/bf16bridge     # the project's copy, inside the root
HELP=/opt/armcheck      # the helper scripts, inside the root
PYV=3.11
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$OUT/steps.log" >&2; }
step() { local name=$1; shift; local t0=$SECONDS; log "start $name"; "$@"; log "done $name in $((SECONDS - t0)) s"; }
[ "$(id -u)" = 0 ] || { echo "arm_check.sh: run as root (debootstrap, chroot, mounts)" >&2; exit 2; }

# -- the host: qemu, debootstrap, binfmt_misc -----------------------------------------------------
host_tools() {
    dpkg -s qemu-user-static debootstrap binfmt-support >/dev/null 2>&1 ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-user-static debootstrap binfmt-support
    mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || true
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
    if ! grep -q enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null; then
        echo "arm_check.sh: binfmt_misc has no enabled qemu-aarch64 entry: arm64 programs cannot run in a chroot here" >&2
        exit 3
    fi
    { qemu-aarch64-static --version | head -1; cat /proc/sys/fs/binfmt_misc/qemu-aarch64; } > "$OUT/host_binfmt.txt"
}

mirror() {  # the Debian archive this machine's apt uses (deb822 first, then one-line format)
    local m
    m=$(awk '/^URIs:/ {u=$2} /^Suites:/ && / bookworm( |$)/ && u ~ /debian\/?$/ {print u; exit}' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$m" ] || m=$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' /etc/apt/sources.list \
        /etc/apt/sources.list.d/*.list 2>/dev/null || true)
    [ -n "$m" ] || { echo "arm_check.sh: no bookworm mirror in /etc/apt/sources.list*" >&2; exit 4; }
    echo "$m"
}

# -- the arm64 root ------------------------------------------------------------------------------
make_root() {
    if [ -f "$ROOT/.arm_check_root_done" ]; then return; fi
    mkdir -p "$ROOT"
    if [ ! -x "$ROOT/debootstrap/debootstrap" ]; then
        debootstrap --arch=arm64 --foreign --include=python3,python3-venv,python3-pip,ca-certificates \
            bookworm "$ROOT" "$(mirror)"
    fi
    cp /usr/bin/qemu-aarch64-static "$ROOT/usr/bin/" 2>/dev/null || true  # for a binfmt entry without F
    chroot "$ROOT" /debootstrap/debootstrap --second-stage
    touch "$ROOT/.arm_check_root_done"
}

unmounts() {  # leave no /dev or /proc bound under the root (an rm -r of it would reach them)
    local m
    for m in dev/pts dev proc sys; do mountpoint -q "$ROOT/$m" 2>/dev/null && umount -l "$ROOT/$m"; done
    return 0
}

mounts() {
    trap unmounts EXIT
    mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
    # not the host's /sys: torch's oneDNN segfaults at import reading an x86 machine's
    # /sys/devices/system/cpu; a small tmpfs shows what an arm64 kernel does (fake_sysfs)
    if mountpoint -q "$ROOT/sys" && [ ! -e "$ROOT/sys/.arm_check" ]; then umount -l "$ROOT/sys"; fi
    mountpoint -q "$ROOT/sys" || { mount -t tmpfs -o size=1m armsys "$ROOT/sys"; touch "$ROOT/sys/.arm_check"; }
    mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
    mountpoint -q "$ROOT/dev/pts" || mount --bind /dev/pts "$ROOT/dev/pts"
    mkdir -p "$ROOT/tmp" && chmod 1777 "$ROOT/tmp"
}

# -- the venv and its wheels ---------------------------------------------------------------------
platform_args() {
    printf -- '--only-binary=:all: --python-version %s --implementation cp --platform linux_aarch64 ' "$PYV"
    printf -- '--platform manylinux2014_aarch64 '
    for i in $(seq 17 36); do printf -- '--platform manylinux_2_%s_aarch64 ' "$i"; done  # bookworm: glibc 2.36
}

requirements() {  # torch's aarch64 wheel is a CUDA build: it will not import without these libraries
    cat <<'EOF'
numpy==2.4.6
ml_dtypes==0.6.0
jax==0.10.2
jaxlib==0.10.2
tensorflow==2.21.0
pytest
packaging
hypothesis==6.170.17
safetensors==0.8.0
absl-py==2.5.1
filelock
typing-extensions>=4.10.0
setuptools>=77.0.3
sympy>=1.13.3
networkx>=2.5.1
jinja2
fsspec>=0.8.5
cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3
nvidia-cudnn-cu13==9.20.0.48
nvidia-cusparselt-cu13==0.8.1
nvidia-nvshmem-cu13==3.4.5
EOF
}

make_venv() {
    [ -x "$ROOT$VENV/bin/python" ] || chroot "$ROOT" /usr/bin/python3 -m venv "$VENV"
    mkdir -p "$WHEELS"
    local P; P=$(platform_args)
    requirements > "$WHEELS/requirements-arm.txt"
    # wheels are fetched and unpacked by this machine's pip (the same files an emulated pip would
    # unpack, minutes faster); constraints.txt's tensorflow-cpu has no aarch64 wheel: tensorflow
    grep -v '^tensorflow-cpu' "$HERE/constraints.txt" > "$WHEELS/constraints-arm.txt"
    # shellcheck disable=SC2086
    pip download -q $P -r "$WHEELS/requirements-arm.txt" -c "$WHEELS/constraints-arm.txt" -d "$WHEELS"
    # torch's own pins name an nccl with no aarch64 wheel: torch without its dependencies, nccl 2.32.6
    # shellcheck disable=SC2086
    pip download -q --no-deps $P torch==2.13.0 nvidia-nccl-cu13==2.32.6 -d "$WHEELS"
    local site="$ROOT$VENV/lib/python$PYV/site-packages" sum
    sum=$(cd "$WHEELS" && ls ./*.whl | sort | md5sum | cut -d' ' -f1)
    if [ "$(cat "$ROOT$VENV/.arm_check_wheels" 2>/dev/null)" != "$sum" ]; then
        # shellcheck disable=SC2086
        pip install -q --no-deps --upgrade $P --target "$site" "$WHEELS"/*.whl
        echo "$sum" > "$ROOT$VENV/.arm_check_wheels"
    fi
    ls "$WHEELS"/*.whl | xargs -n1 basename > "$OUT/wheels.txt"
}

install_project() {  # this working tree as it is now (uncommitted changes too), installed editable
    rm -rf "$ROOT$SRC" && mkdir -p "$ROOT$SRC"
    (cd "$HERE" && git ls-files -z -co --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) |
        tar -xf - -C "$ROOT$SRC"
    (cd "$HERE" && { git log -1 --format='%H %s'; git status --short; }) > "$OUT/project_tree.txt" || true
    if ! chroot "$ROOT" "$VENV/bin/python" -c "import bf16bridge, sys; sys.exit(not bf16bridge.__file__.startswith('$SRC'))" 2>/dev/null; then
        chroot "$ROOT" /usr/bin/env -i PATH="$VENV/bin:/usr/bin:/bin" HOME=/root \
            "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation --no-index -e "$SRC"
    fi
    write_helpers
}

# -- what runs inside ----------------------------------------------------------------------------
write_helpers() {
    mkdir -p "$ROOT$HELP"
    cat > "$ROOT$HELP/cpu.py" <<'EOF'
"""What the emulated CPU shows a program (auxv, /proc/cpuinfo, MIDR_EL1 by MRS) and what the probe's
reader makes of it."""
import ctypes, json, mmap, os, platform, sys
def mrs(word):  # a two-instruction function (mrs x0, <reg>; ret), run
    buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(word.to_bytes(4, "little") + (0xD65F03C0).to_bytes(4, "little"))
    return ctypes.CFUNCTYPE(ctypes.c_uint64)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()
if sys.argv[1:] == ["midr"]:
    print(hex(mrs(0xD5380000)))
    sys.exit(0)
libc = ctypes.CDLL(None)
libc.getauxval.restype, libc.getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
hwcap2 = libc.getauxval(26)
info = open("/proc/cpuinfo").read()
from bf16bridge.capabilities.machine import Reader, read_cpu
r = Reader()
print(json.dumps({"QEMU_CPU": os.environ.get("QEMU_CPU"), "platform.machine": platform.machine(),
                  "AT_HWCAP2": hex(hwcap2), "HWCAP2_BF16 (bit 14)": bool(hwcap2 >> 14 & 1),
                  "HWCAP2_I8MM (bit 13)": bool(hwcap2 >> 13 & 1),
                  "/proc/cpuinfo is the host's x86 file": "avx2" in info or "GenuineIntel" in info or "AuthenticAMD" in info,
                  "Reader.hwcap2()": r.hwcap2(), "read_cpu": read_cpu(r).__dict__}, indent=1, default=str))
EOF
    cat > "$ROOT$HELP/decide.py" <<'EOF'
"""The probe's decisions for each framework (all imported and tried), its compute trials and the
alignment of each framework's fresh allocations, as JSON."""
import json, bf16bridge as bb
caps = bb.probe(frameworks="all")
out = {"cpu": caps.cpu.__dict__, "decisions": {}, "compute": {}, "alignment": {}}
for t in ("numpy", *caps.frameworks):
    fc = caps.numpy if t == "numpy" else caps.frameworks[t]
    if t != "numpy" and not fc.probed:
        out["decisions"][t] = f"not probed: {fc.why}"
        continue
    d, c = caps.decide(t), caps.decide(t, for_compute=True)
    out["decisions"][t] = {"storage": d.dtype, "storage reason": d.reason,
                           "for_compute": c.dtype, "for_compute reason": c.reason}
    out["compute"][t] = [r.__dict__ for r in getattr(fc, "compute", ())]
    out["alignment"][t] = getattr(fc, "alignment", None).__dict__ if getattr(fc, "alignment", None) else None
print(json.dumps(out, indent=1, default=str))
EOF
    cat > "$ROOT$HELP/roundtrip.py" <<'EOF'
"""All 65,536 bf16 bit patterns torch -> numpy -> jax -> torch: bits equal, and each hop's zero-copy
as bb.plan says, checked by data pointers. Four starts: torch.from_numpy over numpy's own allocation
(numpy -> jax copies where it is not 64-byte aligned, and the plan says so), torch's own allocation
(torch.empty), a 64-byte aligned numpy buffer, and bb.aligned_empty(like="torch")."""
import json, warnings, numpy as np, torch, jax, bf16bridge as bb
bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
def ptr(v):
    if isinstance(v, np.ndarray): return v.__array_interface__["data"][0]
    if isinstance(v, torch.Tensor): return v.data_ptr()
    v.block_until_ready(); return v.unsafe_buffer_pointer()
def raw(v):
    if isinstance(v, torch.Tensor): return v.view(torch.uint16).numpy().copy()
    return np.asarray(v).view(np.uint16).copy()
def trip(t0):
    rep, x, ok = {"start pointer % 64": ptr(t0) % 64, "hops": []}, t0, True
    for to in ("numpy", "jax", "torch"):
        p = bb.plan(x, to)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            y = bb.convert(x, to)
        same, shared = bool(np.array_equal(raw(y), bits)), ptr(y) == ptr(x)
        rep["hops"].append({"to": to, "plan.zero_copy": p.zero_copy, "bits equal": same,
                            "same data pointer": shared, "plan agrees with pointers": shared == p.shares_memory})
        ok = ok and same and shared == p.shares_memory
        x = y
    rep["final is the first tensor's memory"] = ptr(x) == ptr(t0)
    rep["ok"] = ok and bool(np.array_equal(raw(x), bits))
    return rep
buf = np.empty(bits.nbytes + 64, dtype=np.uint8)
start = (-buf.ctypes.data) % 64
aligned = buf[start:start + bits.nbytes].view(np.uint16)
aligned[...] = bits
made = bb.aligned_empty(bits.shape, "bfloat16", like="torch")
made.view(torch.uint16).copy_(torch.from_numpy(bits.view(np.int16)).view(torch.uint16))
own = torch.empty(bits.shape, dtype=torch.bfloat16)
own.view(torch.uint16).copy_(torch.from_numpy(bits.view(np.int16)).view(torch.uint16))
out = {"torch.from_numpy over numpy's allocation": trip(torch.from_numpy(bits.copy()).view(torch.bfloat16)),
       "torch.empty": trip(own),
       "64-byte aligned numpy buffer": trip(torch.from_numpy(aligned).view(torch.bfloat16)),
       "aligned_empty(like='torch')": trip(made)}
out["ok"] = all(v["ok"] for v in out.values()) and all(
    out[k]["final is the first tensor's memory"] for k in ("64-byte aligned numpy buffer", "aligned_empty(like='torch')"))
print(json.dumps(out, indent=1))
EOF
}

inside() {  # inside CPU CMD...: run in the root under one emulated CPU, with a clean environment
    local cpu=$1; shift
    QEMU_CPU=$cpu chroot "$ROOT" /usr/bin/env -i QEMU_CPU="$cpu" PATH="$VENV/bin:/usr/bin:/bin" HOME=/root \
        LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 TF_CPP_MIN_LOG_LEVEL=0 "$@"
}

fake_sysfs() {  # /sys/devices/system/cpu as an arm64 kernel shows it, MIDR_EL1 read by MRS
    local cpu=$1 s="$ROOT/sys/devices/system/cpu" n midr i
    n=$(nproc)
    midr=$(inside "$cpu" python "$HELP/cpu.py" midr)
    mkdir -p "$s"
    for f in possible present online; do echo "0-$((n - 1))" > "$s/$f"; done
    for i in $(seq 0 $((n - 1))); do
        mkdir -p "$s/cpu$i/regs/identification"
        printf '0x%016x\n' "$midr" > "$s/cpu$i/regs/identification/midr_el1"
        printf '0x%016x\n' 0 > "$s/cpu$i/regs/identification/revidr_el1"
    done
}

run_cpu() {
    local cpu=$1 d="$OUT/$1" t0
    mkdir -p "$d"
    fake_sysfs "$cpu"
    inside "$cpu" sh -c "cd $SRC && python $HELP/cpu.py" > "$d/cpu.json" 2> "$d/cpu.stderr" || true
    t0=$SECONDS
    inside "$cpu" sh -c "cd $SRC && python -m bf16bridge probe --json --frameworks all" > "$d/probe.json" 2> "$d/probe.json.stderr" || true
    log "$cpu: probe --json $((SECONDS - t0)) s"
    inside "$cpu" sh -c "cd $SRC && python $HELP/decide.py" > "$d/decisions.json" 2> "$d/decisions.stderr" || true
    t0=$SECONDS
    inside "$cpu" sh -c "cd $SRC && python $HELP/roundtrip.py" > "$d/roundtrip.json" 2> "$d/roundtrip.stderr" || true
    log "$cpu: roundtrip $((SECONDS - t0)) s"
}

test_cpu() {
    local cpu=$1 d="$OUT/$1" t0 rc
    mkdir -p "$d"
    fake_sysfs "$cpu"
    t0=$SECONDS; rc=0
    # the tree libraries and the other frameworks' extras are not in this venv: none required
    timeout -k 30 "$TEST_TIMEOUT" bash -c "$(declare -f inside); ROOT=$ROOT VENV=$VENV; inside $cpu sh -c 'cd $SRC && \
        BF16BRIDGE_TEST_LIBRARIES= python -m pytest -q -p no:cacheprovider -rfE --junitxml=/tmp/arm-junit.xml $TESTS'" \
        > "$d/pytest.txt" 2>&1 || rc=$?
    cp "$ROOT/tmp/arm-junit.xml" "$d/junit.xml" 2>/dev/null || true
    echo "rc=$rc seconds=$((SECONDS - t0))" >> "$d/pytest.txt"
    log "$cpu: pytest rc=$rc in $((SECONDS - t0)) s"
}

results_dir() {  # where the project keeps saved results (the bench package's folder once it has one)
    if [ -d "$HERE/bf16bridge/bench/results" ]; then echo "$HERE/bf16bridge/bench/results"; else echo "$HERE/benchmarks/results"; fi
}

summarise() {  # OUT/arm-check.json from what each CPU's run wrote: what was read and decided, no times
    python3 - "$OUT" "${SUMMARY_CPUS:-$CPUS}" "$TESTS" <<'EOF'
import json, re, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, cpus, tests = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split()
def load(p):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as err:
        return {"missing": f"{p.name}: {type(err).__name__}"}
def first_lines(p, n=3):
    try:
        return [l for l in p.read_text(errors="replace").splitlines() if l.strip()][:n]
    except OSError:
        return ["(not written)"]
summary = {"what": "tools/arm_check.sh: qemu-user aarch64, Debian bookworm arm64 root, the aarch64 wheels",
           "wheels": [w for w in first_lines(out / "wheels.txt", 10**4) if re.match(r"(torch|jax|jaxlib|tensorflow|numpy|ml_dtypes)-", w)],
           "tests": tests, "cpus": {}}
for cpu in cpus:
    d, c = out / cpu, {}
    cpuj, dec, rt = load(d / "cpu.json"), load(d / "decisions.json"), load(d / "roundtrip.json")
    c["HWCAP2_BF16 (bit 14)"] = cpuj.get("HWCAP2_BF16 (bit 14)")
    c["HWCAP2_I8MM (bit 13)"] = cpuj.get("HWCAP2_I8MM (bit 13)")
    c["probe cpu"] = {k: dec.get("cpu", {}).get(k) for k in ("arch", "flags", "bf16_compute", "why")}
    c["decisions"] = {t: ({"storage": v["storage"], "for_compute": v["for_compute"],
                           "for_compute reason": v["for_compute reason"]} if isinstance(v, dict) else v)
                      for t, v in dec.get("decisions", {}).items()}
    c["compute trials"] = {t: [{k: r.get(k) for k in ("device", "how", "why")} for r in rows]
                           for t, rows in dec.get("compute", {}).items()}
    c["allocation offsets mod 64"] = {t: (a or {}).get("offsets") for t, a in dec.get("alignment", {}).items()}
    c["roundtrip"] = {k: (v["ok"], v["start pointer % 64"]) if isinstance(v, dict) else v for k, v in rt.items()}
    c["probe stderr"] = first_lines(d / "probe.json.stderr") if (d / "probe.json.stderr").exists() else ["(not written)"]
    c["probe stderr empty"] = (d / "probe.json.stderr").exists() and not (d / "probe.json.stderr").read_text().strip()
    try:
        root = ET.parse(d / "junit.xml").getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        total, failed = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
        c["tests"] = {"ran": total, "failed": failed, "skipped": int(suite.get("skipped")),
                      "failures": sorted(f"{tc.get('classname')}::{tc.get('name')}" for tc in root.iter("testcase")
                                         if tc.find("failure") is not None or tc.find("error") is not None)}
    except (OSError, ET.ParseError, AttributeError, TypeError):  # no report: it did not run, or died
        said = first_lines(d / "pytest.txt", 10**6)
        died = [l.strip() for l in said if l.startswith(("Fatal Python error", "rc="))]
        c["tests"] = {"not run": "; ".join(died) or "no pytest report"}
    summary["cpus"][cpu] = c
(out / "arm-check.json").write_text(json.dumps(summary, indent=1) + "\n")
EOF
    if [ "${ARM_NO_SAVE:-0}" != 1 ]; then
        cp "$OUT/arm-check.json" "$(results_dir)/arm-check.json"
        log "saved $(results_dir)/arm-check.json"
    fi
}

setup() {
    step host_tools host_tools
    step make_root make_root
    mounts
    step make_venv make_venv
}

run() {  # every CPU's records first, then the tests, the summary saved after each: a run cut short keeps what it found
    mounts
    step install_project install_project
    for cpu in $CPUS; do step "run $cpu" run_cpu "$cpu"; done
    summarise
    [ "${ARM_SKIP_TESTS:-0}" = 1 ] && return
    for cpu in $CPUS; do step "tests $cpu" test_cpu "$cpu"; summarise; done
}

case $WHAT in
    setup) setup ;;
    run) run ;;
    tests) mounts; install_project; for cpu in $CPUS; do step "tests $cpu" test_cpu "$cpu"; summarise; done ;;
    summary) summarise ;;
    all) setup; run ;;
    *) echo "arm_check.sh: unknown step $WHAT (setup, run, tests, summary or all)" >&2; exit 2 ;;
esac
log "outputs in $OUT"
