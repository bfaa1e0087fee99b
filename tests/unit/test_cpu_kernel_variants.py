"""Which C-kernel variant a CPU gets, how a library is named and refused, the start-up status
line, `inferd doctor`, and the argmax kernel in every variant this CPU runs."""

from __future__ import annotations

import json
import logging
import re
import shutil

import pytest
import torch
from kernel_variants import VARIANT_NAMES, variant_library

from inferd import cpu_info
from inferd.cli import main
from inferd.cpu_info import cpu_flags, machine
from inferd.cpu_kernels import build, variants
from inferd.cpu_kernels.startup import prepare_cpu_kernels

ENV_SET = "INFERD_CPU_KERNELS=portable"
AVX2_ONLY = frozenset("sse2 avx avx2 fma f16c bmi2".split())  # an AMD EPYC without AVX-512


def names(found) -> list[str]:
    return [v.name for v in found]


def test_each_cpu_gets_the_best_variant_it_has_every_feature_of():
    assert names(variants.runnable(AVX2_ONLY, "x86_64")) == ["avx2", "portable"]
    assert names(variants.runnable(AVX2_ONLY | {"avx_vnni"}, "x86_64")) == [
        "avx2-vnni", "avx2", "portable"]  # fmt: skip
    no_vnni = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl"}
    assert names(variants.runnable(no_vnni, "x86_64"))[0] == "avx512"
    assert names(variants.runnable(no_vnni - {"avx512vl"}, "x86_64"))[0] == "avx2"
    assert names(variants.runnable(frozenset(), "x86_64")) == ["portable"]
    # x86 feature names on another architecture mean nothing
    assert names(variants.runnable(AVX2_ONLY, "aarch64")) == ["portable"]


def test_amx_listed_by_cpuid_chooses_nothing():
    """Some VMs list AMX where the OS never enabled it (its instructions trap): no variant uses
    it, so a CPU that lists it gets exactly what it would without."""
    xeon = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}
    amx = frozenset({"amx_tile", "amx_int8", "amx_bf16"})
    with_amx, without = variants.runnable(xeon | amx, "x86_64"), variants.runnable(xeon, "x86_64")
    assert names(with_amx) == names(without)
    for v in variants.VARIANTS:
        assert not any("amx" in f for f in (*v.needs, *variants.target_flags(v, "x86_64")))


def test_inferd_cpu_kernels_values():
    assert variants.requested(None) == variants.requested("auto") == "auto"
    assert variants.requested("0") == variants.requested("off") == "off"
    assert variants.requested(" AVX2 ") == "avx2"
    with pytest.raises(ValueError, match=r"INFERD_CPU_KERNELS must be one of auto, 0, .*'sse9'"):
        variants.requested("sse9")


def test_the_library_checks_every_feature_its_variant_needs():
    check = build.CHECK_SOURCE.read_text()
    for v in variants.VARIANTS:
        for feature in v.needs:
            assert f"#ifdef INFERD_NEEDS_{feature.upper()}\n" in check, (v.name, feature)


def test_library_names_say_their_variant_and_never_the_build_machine(monkeypatch):
    cc = build.compiler() if shutil.which("cc") else "cc"
    paths = {v.name: build.library_path(v, cc) for v in variants.VARIANTS}
    for name, path in paths.items():
        assert re.fullmatch(rf"inferd_kernels-{name}-[0-9a-f]{{16}}\.so", path.name)
    assert len(set(paths.values())) == len(paths)
    for v in variants.VARIANTS:
        assert not any("native" in flag for flag in variants.target_flags(v))
    # the key is the same whichever CPU computes it: a shared cache holds one file per variant
    monkeypatch.setattr("inferd.cpu_info._cpuinfo", lambda: "flags\t: sse2\n")
    assert {v.name: build.library_path(v, cc) for v in variants.VARIANTS} == paths


def test_a_forced_variant_this_cpu_lacks_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(build, "cpu_flags", lambda: AVX2_ONLY)
    monkeypatch.setattr(variants, "cpu_flags", lambda: AVX2_ONLY)
    monkeypatch.setattr(build, "machine", lambda: "x86_64")
    monkeypatch.setattr(variants, "machine", lambda: "x86_64")
    with pytest.raises(build.KernelsUnavailable,
                       match="INFERD_CPU_KERNELS=avx512-vnni, but this CPU lacks avx512f, "
                             "avx512bw, avx512vl, avx512_vnni"):  # fmt: skip
        build.choose("avx512-vnni")
    with pytest.raises(build.KernelsUnavailable, match="turned off by INFERD_CPU_KERNELS=0"):
        build.choose("off")


def test_a_library_refuses_to_load_on_a_cpu_without_its_features(monkeypatch):
    """The check inside the library asks the CPU itself (cpuid), whatever Python chose."""
    # the CPU's real features: a library refuses only what the CPU lacks, not what
    # INFERD_CPU_FEATURES_OFF hides from Python
    monkeypatch.delenv("INFERD_CPU_FEATURES_OFF", raising=False)
    lacking = [v for v in variants.VARIANTS if v.missing(cpu_flags(), machine())]
    if not lacking:
        pytest.skip("this CPU has every variant's features: nothing it would refuse")
    # compiling works on any CPU; running would not. Unoptimised: the refusal does not depend
    # on it, and -O3 for a variant this CPU never runs took ~25 s here.
    monkeypatch.setattr(build, "FLAGS", tuple("-O0" if f == "-O3" else f for f in build.FLAGS))
    path, _ = build.build(lacking[0])
    with pytest.raises(build.KernelsUnavailable, match="needs CPU features this CPU lacks: "):
        build.load(path, lacking[0].name)


def test_the_best_variant_is_chosen_and_loads():
    kernels = build.choose("auto")
    assert kernels.variant == variants.runnable()[0].name
    assert kernels.lib.inferd_kernel_isa().decode() == kernels.variant
    assert kernels.path.name.startswith(f"inferd_kernels-{kernels.variant}-")


def test_start_up_says_which_kernels_run(monkeypatch, capsys, caplog):
    monkeypatch.delenv("INFERD_CPU_KERNELS", raising=False)
    kernels = prepare_cpu_kernels(torch.device("cpu"))
    assert kernels is not None
    line = capsys.readouterr().err.strip().splitlines()[-1]  # after any "compiling" lines
    built = r"\((cached|built in \d+\.\d s)\)"
    assert re.fullmatch(rf"inferd: cpu kernels: {kernels.variant} {built}", line)

    monkeypatch.setenv("INFERD_CPU_KERNELS", "portable")
    prepare_cpu_kernels(torch.device("cpu"))
    forced = r"inferd: cpu kernels: portable \((cached|built in \d+\.\d s)\), forced by " + ENV_SET
    # NOTE: the last line: a cache without the portable build first says it is compiling
    assert re.fullmatch(forced, capsys.readouterr().err.strip().splitlines()[-1])

    monkeypatch.setenv("INFERD_CPU_KERNELS", "0")
    with caplog.at_level(logging.WARNING):
        assert prepare_cpu_kernels(torch.device("cpu")) is None
    assert "none (turned off by INFERD_CPU_KERNELS=0); using PyTorch ops" in caplog.text
    assert caplog.records[-1].levelno == logging.WARNING

    monkeypatch.setenv("INFERD_CPU_KERNELS", "avx3")
    with pytest.raises(ValueError, match="INFERD_CPU_KERNELS must be one of"):
        prepare_cpu_kernels(torch.device("cpu"))
    assert prepare_cpu_kernels(torch.device("meta")) is None  # not a CPU step: nothing to say


def test_doctor_prints_what_a_bug_report_needs(capsys):
    assert main(["doctor", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    kernels = build.current_kernels()
    assert facts["cpu kernels"].startswith(f"{kernels.variant} (")
    assert facts["why this variant"] == kernels.reason
    assert facts["kernel variants"] == variants.describe()
    assert set(facts["cpu features"].split()) <= cpu_flags()
    assert facts["torch"].startswith(torch.__version__)
    assert facts["CUDA available"] == torch.cuda.is_available()
    for key in ("inferd", "cpu", "compiler", "cache", "threads", "OMP_NUM_THREADS"):
        assert facts[key], key
    assert main(["doctor"]) == 0
    assert "cpu kernels:" in capsys.readouterr().out


def test_features_can_be_turned_off_to_act_as_an_older_cpu(monkeypatch, capsys):
    """INFERD_CPU_FEATURES_OFF: every choice made from the CPU's features follows (the variant,
    bf16 or not), as on a CPU without them; doctor says so."""
    from inferd.cpu_info import cpu_has_fast_bf16

    monkeypatch.setattr("inferd.cpu_info._cpuinfo", lambda: "flags\t: sse2 avx2 fma f16c "
                        "avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx_vnni\n")  # fmt: skip
    monkeypatch.setattr(variants, "machine", lambda: "x86_64")
    monkeypatch.delenv("INFERD_CPU_FEATURES_OFF", raising=False)
    assert variants.runnable()[0].name == "avx512-vnni" and cpu_has_fast_bf16()
    monkeypatch.setenv("INFERD_CPU_FEATURES_OFF", "avx512*, avx_vnni")  # an AVX2-only CPU
    assert "avx512f" not in cpu_flags() and "avx2" in cpu_flags()
    assert variants.runnable()[0].name == "avx2" and not cpu_has_fast_bf16()
    assert main(["doctor", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["INFERD_CPU_FEATURES_OFF"] == "avx512* avx_vnni"
    assert facts["cpu features"] == "avx2 fma f16c"


def test_doctor_says_which_mode_runs_by_default(capsys):
    from inferd.cpu_info import default_cpu_dtype

    assert main(["doctor", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    expected = "gguf: the file's blocks with C kernels at every step size"
    if facts["cpu kernels"].startswith("none"):
        expected = f"{default_cpu_dtype()} weights dequantised from the file"
    assert facts["default on this CPU, GGUF file"].startswith(expected)
    assert facts["default on this CPU, HF folder"] == f"{default_cpu_dtype()} weights"


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_argmax_kernel_agrees_with_torch_on_ties_and_nan(variant):
    lib = variant_library(variant)
    torch.manual_seed(0)
    x = torch.randn(6, 1000)
    x[1, [10, 700]] = 50.0  # a tie: the lowest index wins
    x[2, 999] = 60.0  # the last element
    x[3, [5, 300]] = float("nan")  # NaN counts as the maximum, first one
    x[4] = -float("inf")
    x[5, 0] = 70.0
    for cols in (1000, 37):  # 37: not whole chunks
        part = x[:, :cols].contiguous()
        out = torch.empty(6, dtype=torch.int64)
        lib.inferd_argmax_rows(part.data_ptr(), 6, cols, out.data_ptr())
        assert torch.equal(out, part.argmax(dim=-1))


@pytest.mark.parametrize("enabled", [True, False])
def test_amx_flags_count_only_where_the_os_enables_amx(monkeypatch, enabled):
    # A VM's cpuid may list AMX where its instructions trap: then inferd drops the amx flags
    # (and with them AMX's claim to fast bf16).
    monkeypatch.setattr("inferd.cpu_info._cpuinfo",
                        lambda: "flags\t: sse2 avx2 amx_tile amx_int8 amx_bf16\n")  # fmt: skip
    monkeypatch.setattr("inferd.cpu_info.os_enables_amx", lambda: enabled)
    flags = cpu_info.cpu_flags()
    assert (
        flags & {"amx_tile", "amx_int8", "amx_bf16"} == {"amx_tile", "amx_int8", "amx_bf16"}
    ) is enabled
    assert "avx2" in flags
    assert cpu_info.cpu_has_fast_bf16() is enabled


def test_os_amx_check_agrees_with_the_kernel():
    # Where the OS supports AMX's state, a process may request it (ARCH_REQ_XCOMP_PERM); the
    # check must never claim AMX where that request fails. Run in a child: a granted request
    # changes the process.
    import subprocess
    import sys

    code = ("import ctypes; from inferd import cpu_info; "
            "ok = ctypes.CDLL(None).syscall(158, 0x1023, 18) == 0; "
            "print(cpu_info.os_enables_amx(), ok)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    claimed, granted = out.stdout.split()
    if cpu_info.machine() == "x86_64":
        assert claimed == granted
    else:
        assert claimed == "False"


def test_doctor_names_the_flags_the_os_leaves_disabled(monkeypatch):
    monkeypatch.setattr(
        "inferd.cpu_info._cpuinfo", lambda: "flags\t: sse2 avx2 amx_tile amx_int8\n"
    )
    monkeypatch.setattr("inferd.cpu_info.os_enables_amx", lambda: False)
    from inferd.commands import doctor

    monkeypatch.setattr(doctor, "_kernel_facts", dict)  # the CPU facts only: no kernel build
    monkeypatch.setattr(doctor, "_torch_facts", dict)
    facts = doctor.collect()
    assert facts["listed, not enabled by the OS"] == "amx_tile amx_int8 (treated as absent)"
    assert "amx" not in facts["cpu features"]


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_argmax_kernel_splits_few_long_rows_without_changing_the_answer(variant):
    # Fewer rows than threads: each row is cut into parts (argmax.c, PART_MIN columns at
    # least), maxima and NaNs placed around the cuts.
    lib = variant_library(variant)
    cols = 3 * 16384 + 7
    x = torch.randn(5, cols, generator=torch.Generator().manual_seed(2))
    x[0, [cols // 2 - 1, cols // 2, cols - 1]] = 80.0  # a tie across the middle cut
    x[1, [5, cols - 2]] = float("nan")  # NaN in the first part and the last
    x[2, cols - 3] = float("nan")  # NaN only in the last part, a larger value before it
    x[2, 0] = 99.0
    x[3] = -float("inf")
    x[4, cols - 1] = 99.0
    before = torch.get_num_threads()  # the kernels' OpenMP threads too
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for i in range(5):
                row, out = x[i : i + 1].contiguous(), torch.empty(1, dtype=torch.int64)
                lib.inferd_argmax_rows(row.data_ptr(), 1, cols, out.data_ptr())
                assert out.item() == row.argmax(dim=-1).item(), (i, threads)
            out = torch.empty(5, dtype=torch.int64)
            lib.inferd_argmax_rows(x.data_ptr(), 5, cols, out.data_ptr())
            assert torch.equal(out, x.argmax(dim=-1))
    finally:
        torch.set_num_threads(before)
