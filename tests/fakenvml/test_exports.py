"""The library exports every function NVIDIA's nvml.h declares, plus the names the header
maps onto them — checked with a second, independent reading of the header (the build
uses gcc -aux-info; this test reads the preprocessed text), against `nm -D`."""

from __future__ import annotations

import re
import subprocess

from fakenvml import library
from fakenvml.native import build, header


def preprocessed_declarations() -> set[str]:
    text = subprocess.run(
        ["gcc", "-E", "-P", *header.DEFINES, "-x", "c", str(header.path())],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    text = re.sub(r"__attribute__\s*\(\(.*?\)\)", "", text)
    return set(re.findall(r"\b(nvml\w+)\s*\([^;{)]*(?:\([^)]*\)[^;{)]*)*\)\s*;", text))


def exported() -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(library.path())],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {line.split()[-1] for line in out.splitlines() if line.split()[-1].startswith("nvml")}


def test_every_declared_function_is_exported() -> None:
    declared = preprocessed_declarations()
    assert len(declared) >= 400, "the header parse found too little: is nvml.h the right one?"
    missing = declared - exported()
    assert not missing, f"declared in nvml.h but not exported: {sorted(missing)}"


def test_the_two_header_readings_agree() -> None:
    assert preprocessed_declarations() == {d.name for d in header.declarations(header.path())}


def test_versioned_and_unversioned_names_are_both_exported() -> None:
    names = exported()
    for old, new in header.aliases(header.path()).items():
        if new.endswith("_t"):  # type aliases, not functions
            continue
        assert {old, new} <= names, f"{old} -> {new}"
    for probed in ("nvmlInit_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
                   "nvmlDeviceGetPciInfo_v3", "nvmlEventSetWait_v2",
                   "nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlErrorString"):  # fmt: skip
        assert probed in names


def test_only_nvml_symbols_and_the_control_planes_are_exported() -> None:
    """Beyond nvml*, the fakenvml_* entries state_format.h declares for the control plane
    (fakenvml/mig.py); no internal helper (fnv_*) leaks."""
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(library.path())],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    others = {ln.split()[-1] for ln in out.splitlines() if not ln.split()[-1].startswith("nvml")}
    contract = set(re.findall(r"\b(fakenvml_\w+)\s*\(", (build.SRC / "state_format.h").read_text()))
    assert contract == {"fakenvml_mig_change", "fakenvml_mig_uuid"}
    assert others == contract, "internal helpers leak into the dynamic symbol table"


def test_soname_is_libnvidia_ml_so_1() -> None:
    out = subprocess.run(
        ["readelf", "-d", str(library.path())], capture_output=True, text=True, check=True
    ).stdout
    assert "Library soname: [libnvidia-ml.so.1]" in out


def test_unimplemented_functions_answer_not_supported() -> None:
    import ctypes

    lib = library.preload()
    handle = ctypes.c_void_p()
    # Unit and vGPU queries are generated stubs: they answer, never crash.
    value = ctypes.c_uint()
    assert lib.nvmlUnitGetCount(ctypes.byref(value)) == 3  # NVML_ERROR_NOT_SUPPORTED
    assert lib.nvmlDeviceGetVgpuCapabilities(handle, 0, ctypes.byref(value)) == 3
