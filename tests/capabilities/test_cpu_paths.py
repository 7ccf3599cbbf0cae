"""Every OS path of the CPU reader (bf16bridge.capabilities.machine), each on what a real machine gave:
/proc/cpuinfo lines, auxv words, sysctl answers, CPUID words, IsProcessorFeaturePresent answers.

The readings are injected through a Reader; the decoding is the probe's own. Where each recording comes
from is said beside it (docs/probe.md, "Where the CPU is read", says which paths ran for real)."""

from __future__ import annotations

import platform

import pytest

import bf16bridge as bb
from bf16bridge.capabilities import cpuid as cpuid_mod
from bf16bridge.capabilities.machine import Reader, read_cpu


class Recorded(Reader):
    """A machine given by what its OS and CPU answered; None where that OS has no such answer."""

    def __init__(self, machine, system, cpuinfo="", hwcap=None, hwcap2=None, sysctl=None, cpuid=None, xcr0=None,
                 windows=None):
        self._m, self._s, self._info, self._hw, self._hw2 = machine, system, cpuinfo, hwcap, hwcap2
        self._sysctl, self._cpuid, self._xcr0, self._win = sysctl or {}, cpuid, xcr0, windows
        self.asked: list = []

    def machine(self):
        return self._m

    def system(self):
        return self._s

    def cpu_count(self):
        return 8

    def cpuinfo(self):
        return self._info

    def hwcap(self):
        return self._hw

    def hwcap2(self):
        return self._hw2

    def sysctl(self, name):
        self.asked.append(("sysctl", name))
        return self._sysctl.get(name) if self._s == "Darwin" else None

    def cpuid(self, leaf, subleaf=0):
        self.asked.append(("cpuid", leaf, subleaf))
        if self._cpuid is None:
            return None
        return self._cpuid.get((leaf, subleaf), (0, 0, 0, 0))

    def xcr0(self):
        return self._xcr0

    def windows_feature(self, code):
        self.asked.append(("windows", code))
        return None if self._win is None else self._win.get(code, False)


def aida(text: str) -> dict:
    """CPUID words from AIDA64-style lines ("CPUID 00000007: 00000002-F3BFBFFB-BB417FEE-FFDD4430 [SL 00]")."""
    out = {}
    for line in text.strip().splitlines():
        head, _, rest = line.partition(": ")
        leaf = int(head.split()[1], 16)
        words = tuple(int(w, 16) for w in rest.split()[0].split("-"))
        sub = int(rest.split("[SL ")[1][:2], 16) if "[SL " in rest else 0
        out[(leaf, sub)] = words
    return out


# -- x86 CPUID words of real CPUs (anrieff/libcpuid tests/: AIDA64 dumps) ------------------------------
# Sapphire Rapids: Xeon w7-2475X (tests/intel/sapphire_rapids/sapphire-rapids-ws-xeon-w7.test)
SAPPHIRE_RAPIDS = aida("""
CPUID 00000000: 00000020-756E6547-6C65746E-49656E69
CPUID 00000001: 000806F8-00800800-7FFEFBFF-BFEBFBFF
CPUID 00000007: 00000002-F3BFBFFB-BB417FEE-FFDD4430 [SL 00]
CPUID 00000007: 00001C30-00000000-00000000-00000000 [SL 01]
""")
# Zen 4: Ryzen 7 7700X (tests/amd/zen4/amd-ryzen-7-7700x-8-core-processor.test)
ZEN4 = aida("""
CPUID 00000000: 00000010-68747541-444D4163-69746E65
CPUID 00000001: 00A60F12-00100800-7EF8320B-178BFBFF
CPUID 00000007: 00000001-F1BF97A9-00405FCE-10000010 [SL 00]
CPUID 00000007: 00000020-00000000-00000000-00000000 [SL 01]
""")
# Zen 3: Ryzen 9 5950X (tests/amd/zen3/amd-ryzen-9-5950x-16-core-processor.test): leaf 7 has no subleaf 1
ZEN3 = aida("""
CPUID 00000000: 00000010-68747541-444D4163-69746E65
CPUID 00000001: 00A20F10-00200800-7ED8320B-178BFBFF
CPUID 00000007: 00000000-219C97A9-0040068C-00000010 [SL 00]
""")
# XCR0 is the OS's, not in a CPUID dump: each CPU's CPUID.(0xD,0):EAX (the states it can save), as an OS
# saving them all sets it (Linux does; AMX's bits on Sapphire Rapids too)
XCR0 = {"spr": 0x602E7, "zen4": 0x2E7, "zen3": 0x207}


@pytest.mark.parametrize("words,xcr0,flags,bf16", [
    (SAPPHIRE_RAPIDS, XCR0["spr"], ("avx512_bf16", "amx_bf16", "avx512f", "avx2"), True),
    (ZEN4, XCR0["zen4"], ("avx512_bf16", "avx512f", "avx2"), True),
    (ZEN3, XCR0["zen3"], ("avx2",), False),
    # an OS saving no AMX tiles (XCR0 without bits 17, 18): AVX512_BF16 still counts, AMX_BF16 does not
    (SAPPHIRE_RAPIDS, 0x2E7, ("avx512_bf16", "avx512f", "avx2"), True),
    # an OS saving no AVX-512 state: the CPU has AVX512_BF16, nothing can run it
    (ZEN4, 0x7, ("avx2",), False),
])
def test_windows_x86_reads_cpuid_and_xcr0(words, xcr0, flags, bf16):
    r = Recorded("AMD64", "Windows", cpuid=words, xcr0=xcr0)
    cpu = read_cpu(r)
    assert cpu.flags == flags and cpu.bf16_compute is bf16, cpu
    assert "CPUID leaf 7" in cpu.why
    if words is ZEN3:
        assert ("cpuid", 7, 1) not in r.asked  # subleaf 1 past the last one CPUID.(7,0):EAX names: not read
    if xcr0 == 0x7:
        assert "not enabled by the OS" in cpu.why and "AVX512_BF16" in cpu.why


def test_an_intel_mac_reads_cpuid_and_rosetta_says_no_avx512():
    # an Intel Mac: no /proc/cpuinfo; sysctl.proc_translated is 0 (a native process) -> CPUID
    intel = Recorded("x86_64", "Darwin", sysctl={"sysctl.proc_translated": "0"}, cpuid=ZEN3, xcr0=XCR0["zen3"])
    assert read_cpu(intel).flags == ("avx2",) and not read_cpu(intel).bf16_compute
    # an x86-64 Python under Rosetta 2 on an M2: proc_translated 1 (Apple's documented test), FEAT_BF16 1
    rosetta = Recorded("x86_64", "Darwin", sysctl={"sysctl.proc_translated": "1", "hw.optional.arm.FEAT_BF16": "1"})
    cpu = read_cpu(rosetta)
    assert not cpu.bf16_compute and cpu.flags == ()
    assert "Rosetta 2" in cpu.why and "FEAT_BF16 = 1" in cpu.why and "arm64 Python" in cpu.why
    assert not any(a[0] == "cpuid" for a in rosetta.asked)  # translated CPUID answers for no real CPU


def test_x86_with_nothing_readable_says_so():
    cpu = read_cpu(Recorded("AMD64", "Windows", cpuid=None))
    assert not cpu.bf16_compute and "could not read the CPU flags" in cpu.why
    old = read_cpu(Recorded("x86_64", "Windows", cpuid={(0, 0): (5, 0, 0, 0)}))  # no leaf 7
    assert not old.bf16_compute and "no leaf 7" in old.why


def test_linux_x86_reads_proc_cpuinfo_first():
    r = Recorded("x86_64", "Linux", cpuinfo="processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n", cpuid=ZEN3)
    cpu = read_cpu(r)
    assert cpu.flags == ("avx512_bf16", "avx512f", "avx2") and "/proc/cpuinfo" in cpu.why
    assert not any(a[0] == "cpuid" for a in r.asked)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="runs CPUID: x86-64 only")
def test_cpuid_run_here_agrees_with_the_kernels_flags():
    """The CPUID path (Windows' and an Intel Mac's), run on this CPU for real, against /proc/cpuinfo."""
    here = Reader()
    words = here.cpuid(0)
    assert words is not None and words[0] >= 1  # the instruction ran: at least leaf 1
    via_cpuid = read_cpu(type("NoProc", (Reader,), {"cpuinfo": lambda self: "", "system": lambda self: "Windows"})())
    try:
        with open("/proc/cpuinfo") as f:
            proc = f.read()
    except OSError:
        pytest.skip("no /proc/cpuinfo to compare with")
    assert via_cpuid.flags == read_cpu(here).flags and via_cpuid.bf16_compute == read_cpu(here).bf16_compute
    vendor = b"".join(w.to_bytes(4, "little") for w in (words[1], words[3], words[2])).decode()
    assert vendor in proc  # the same CPU: its vendor string, as the kernel shows it


# -- Arm -----------------------------------------------------------------------------------------------
# linux arch/arm64/include/uapi/asm/hwcap.h: AT_HWCAP2's bits 0..16, named as /proc/cpuinfo names them
HWCAP2_BITS = ("dcpodp", "sve2", "sveaes", "svepmull", "svebitperm", "svesha3", "svesm4", "flagm2", "frint",
               "svei8mm", "svef32mm", "svef64mm", "svebf16", "i8mm", "bf16", "dgh", "rng")
# /proc/cpuinfo Features of AWS instances (a Graviton verification report: c6g.xlarge, c7g.xlarge)
GRAVITON2 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
GRAVITON3 = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop "
             "sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm paca pacg dcpodp svei8mm svebf16 i8mm "
             "bf16 dgh rng")


def hwcap2_of(features: str) -> int:
    """The AT_HWCAP2 word the kernel hands a process whose /proc/cpuinfo lists ``features``."""
    words = features.split()
    return sum(1 << bit for bit, name in enumerate(HWCAP2_BITS) if name in words)


@pytest.mark.parametrize("features,bf16,flags", [
    (GRAVITON2, False, ()), (GRAVITON3, True, ("bf16", "i8mm"))])
def test_linux_arm64_reads_hwcap2_bits_14_and_13(features, bf16, flags):
    word = hwcap2_of(features)
    assert word == (0x1F201 if bf16 else 0)
    cpu = read_cpu(Recorded("aarch64", "Linux", cpuinfo=f"Features\t: {features}\n", hwcap2=word))
    assert cpu.bf16_compute is bf16 and cpu.flags == flags and "(HWCAP2)" in cpu.why
    # where getauxval is missing, the Features line says the same
    alone = read_cpu(Recorded("aarch64", "Linux", cpuinfo=f"Features\t: {features}\n"))
    assert alone.bf16_compute is bf16 and alone.flags == flags and "(cpuinfo)" in alone.why


def test_linux_arm64_believes_hwcap2_over_a_features_line():
    """qemu-user's /proc/cpuinfo is the host's; HWCAP2 is the emulated CPU's (FACTS: cortex-a72 gives 0)."""
    cpu = read_cpu(Recorded("aarch64", "Linux", cpuinfo="flags\t: fpu avx2 bf16\n", hwcap2=0))
    assert not cpu.bf16_compute and "(HWCAP2)" in cpu.why


@pytest.mark.parametrize("chip,answers,bf16,flags", [
    ("M1", {"hw.optional.arm.FEAT_BF16": "0", "hw.optional.arm.FEAT_I8MM": "0"}, False, ()),
    ("M2", {"hw.optional.arm.FEAT_BF16": "1", "hw.optional.arm.FEAT_I8MM": "1"}, True, ("bf16", "i8mm")),
])
def test_macos_arm64_reads_sysctl(chip, answers, bf16, flags):
    cpu = read_cpu(Recorded("arm64", "Darwin", sysctl=answers))
    assert cpu.bf16_compute is bf16 and cpu.flags == flags and "(sysctl)" in cpu.why, chip


@pytest.mark.parametrize("answers,bf16,flags,said", [
    # Snapdragon X (Oryon: FEAT_BF16 and FEAT_I8MM, as Oryon's Linux Features list bf16 and i8mm) on 11 24H2
    ({68: True, 66: True}, True, ("bf16", "i8mm"), "IsProcessorFeaturePresent"),
    # the same CPU on a Windows that predates the constants: every unknown feature reads False
    ({}, False, (), "before 11 24H2"),
])
def test_windows_arm64_asks_is_processor_feature_present(answers, bf16, flags, said):
    r = Recorded("ARM64".lower(), "Windows", windows=answers)
    cpu = read_cpu(r)
    assert cpu.bf16_compute is bf16 and cpu.flags == flags and said in cpu.why
    assert ("windows", 68) in r.asked  # PF_ARM_V86_BF16_INSTRUCTIONS_AVAILABLE


# linux arch/arm/include/uapi/asm/hwcap.h (32-bit Arm's AT_HWCAP), the bits these lines name
HWCAP32_BITS = {"half": 1, "thumb": 2, "fastmult": 4, "vfp": 6, "edsp": 7, "neon": 12, "vfpv3": 13, "vfpv3d16": 14,
                "tls": 15, "vfpv4": 16, "idiva": 17, "idivt": 18, "vfpd32": 19, "lpae": 20, "evtstrm": 21,
                "fphp": 22, "asimdhp": 23, "asimddp": 24, "asimdfhm": 25, "asimdbf16": 26, "i8mm": 27}
# a Raspberry Pi 4 (Cortex-A72) running a 32-bit userland (its /proc/cpuinfo, v7l)
PI4_32 = "half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm crc32"
# a 32-bit userland on an Armv8.6 core: the compat words Linux's arm64 kernel lists (not a recording)
V86_32 = PI4_32 + " fphp asimdhp asimddp asimdfhm asimdbf16 i8mm"


def hwcap32_of(features: str) -> int:
    return sum(1 << HWCAP32_BITS[w] for w in features.split() if w in HWCAP32_BITS)


@pytest.mark.parametrize("machine", ["armv8l", "armv7l"])
@pytest.mark.parametrize("features,bf16", [(PI4_32, False), (V86_32, True)])
def test_32_bit_arm_reads_hwcap_bit_26_or_the_asimdbf16_word(machine, features, bf16):
    info = f"Features\t: {features}\n"
    cpu = read_cpu(Recorded(machine, "Linux", cpuinfo=info, hwcap=hwcap32_of(features), hwcap2=1 << 14))
    assert cpu.bf16_compute is bf16 and "(HWCAP)" in cpu.why  # HWCAP2 bit 14 is not FEAT_BF16 there
    words = read_cpu(Recorded(machine, "Linux", cpuinfo=info))
    assert words.bf16_compute is bf16 and "(cpuinfo)" in words.why
    assert ("bf16" in words.flags) is bf16 and ("i8mm" in words.flags) is bf16


def test_the_decoders_take_the_documented_bits():
    """The bit positions, one by one: each set alone turns on its flag and nothing else."""
    base = {(0, 0): (7, 0, 0, 0), (1, 0): (0, 0, 1 << 27, 0), (7, 0): (1, 0, 0, 0), (7, 1): (0, 0, 0, 0)}
    for (leaf, sub, reg, bit), flag in {(7, 1, 0, 5): "avx512_bf16", (7, 0, 3, 22): "amx_bf16",
                                        (7, 0, 1, 16): "avx512f", (7, 0, 1, 5): "avx2"}.items():
        words = dict(base)
        row = list(words[(leaf, sub)])
        row[reg] |= 1 << bit
        words[(leaf, sub)] = tuple(row)
        found, _ = cpuid_mod.decode(lambda lf, sb: words.get((lf, sb), (0, 0, 0, 0)), 0x602E7)
        assert found == {flag}, (flag, found)


def test_probe_reports_a_recorded_machine_and_decides_from_it():
    caps = bb.probe(reader=type("SPR", (Recorded,), {"ml_dtypes": lambda self: (True, "works"),
                                                      "numpy_bf16_dlpack": lambda self: (False, "no")})(
        "AMD64", "Windows", cpuid=SAPPHIRE_RAPIDS, xcr0=XCR0["spr"]), trials=False)  # trials run on this machine
    assert caps.cpu.bf16_compute and caps.cpu.os == "Windows"
    assert "AVX512_BF16 and AMX_BF16 present (CPUID leaf 7)" in caps.cpu.why
