"""The fake pynvml speaks the installed pynvml's language: same names, codes, classes and fields.

The real bindings import without a GPU (they load libnvidia-ml only in nvmlInit), so the fake can
be checked against them here; if nvidia-ml-py renames or renumbers something, these fail first.
"""

from __future__ import annotations

import inspect
from typing import Any

import pynvml
import pytest
from fakes import fake_pynvml


def _public(module: Any, prefix: str) -> dict[str, Any]:
    return {name: getattr(module, name) for name in dir(module) if name.startswith(prefix)}


def test_error_codes_match_the_bindings() -> None:
    fake_codes = _public(fake_pynvml, "NVML_ERROR_")
    real_codes = _public(pynvml, "NVML_ERROR_")
    assert fake_codes == {name: real_codes[name] for name in fake_codes}
    assert set(real_codes) <= set(fake_codes), "a new NVML error code: add it to the fake"


def test_error_subclasses_have_the_bindings_names_and_mapping() -> None:
    fake_classes = {name for name in dir(fake_pynvml) if name.startswith("NVMLError_")}
    real_classes = {name for name in dir(pynvml) if name.startswith("NVMLError_")}
    assert fake_classes == real_classes
    for name in sorted(fake_classes):
        code = getattr(pynvml, name)(0).value
        fake_error = fake_pynvml.NVMLError(code)
        assert type(fake_error).__name__ == name
        assert isinstance(fake_error, getattr(fake_pynvml, name))
        assert fake_error.value == code


def test_error_messages_match_the_bindings_table() -> None:
    for code, text in pynvml.NVMLError._errcode_to_string.items():
        assert str(fake_pynvml.NVMLError(code)) == text


@pytest.mark.parametrize(
    "prefix", ["NVML_DEVICE_ARCH_", "nvmlEventType", "NVML_GPU_RECOVERY_ACTION_", "NVML_VALUE_TYPE_"]
)
def test_constants_match_the_bindings(prefix: str) -> None:
    for name, value in _public(fake_pynvml, prefix).items():
        assert getattr(pynvml, name) == value, name
    assert fake_pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    assert fake_pynvml.nvmlMemory_v2 == pynvml.nvmlMemory_v2


@pytest.mark.parametrize(
    "structure",
    [
        "c_nvmlMemory_t",
        "c_nvmlMemory_v2_t",
        "nvmlPciInfo_t",
        "nvmlPciInfo_v2_t",
        "c_nvmlFieldValue_t",
        "c_nvmlValue_t",
    ],
)
def test_structures_have_the_bindings_fields(structure: str) -> None:
    names = [entry[0] for entry in getattr(fake_pynvml, structure)._fields_]
    assert names == [entry[0] for entry in getattr(pynvml, structure)._fields_]


def test_every_fake_function_exists_in_the_bindings_with_the_same_parameters() -> None:
    functions = {
        name: fn
        for name, fn in vars(fake_pynvml).items()
        if name.startswith("nvml") and inspect.isfunction(fn) and fn.__module__ == fake_pynvml.__name__
    }
    assert "nvmlDeviceGetCudaComputeCapability" in functions
    for name, fn in functions.items():
        real = inspect.unwrap(getattr(pynvml, name))
        assert list(inspect.signature(fn).parameters) == list(inspect.signature(real).parameters), name
