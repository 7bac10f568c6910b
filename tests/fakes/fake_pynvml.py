"""A stand-in for the pynvml module (nvidia-ml-py) on machines without an NVIDIA GPU.

It keeps the real bindings' surface: the same function names and arguments, the same
NVML_ERROR_* codes, an NVMLError whose constructor returns the NVMLError_* subclass for the code
(generated with pynvml's own naming rule), ctypes structures with the same fields (so .busId is
bytes and .total an int), and NVML's behaviour where the tests lean on it: calls before nvmlInit
fail with Uninitialized, no driver means Library Not Found, a GPU that fell off the bus answers
GPU is lost, registering for an event type the GPU does not support is Not Supported, and the
event wait blocks up to its timeout and then raises Timeout.

The hardware behind it is a FakeDriver that a test installs with install(); test_inventory_fake
checks these names and codes against the installed pynvml.
"""

from __future__ import annotations

import string
import struct
import sys
import threading
import time
from collections import deque
from ctypes import (
    Structure,
    Union,
    c_char,
    c_double,
    c_int,
    c_int64,
    c_longlong,
    c_uint,
    c_uint32,
    c_ulong,
    c_ulonglong,
    c_ushort,
)
from dataclasses import dataclass, field
from typing import Any

MiB = 2**20

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_ARCH_KEPLER = 2
NVML_DEVICE_ARCH_MAXWELL = 3
NVML_DEVICE_ARCH_PASCAL = 4
NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_TURING = 6
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_ADA = 8
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_ARCH_BLACKWELL = 10
NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF

NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1

nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeClock = 0x0000000000000010
nvmlEventTypeNone = 0x0000000000000000

NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_GPU_RECOVERY_ACTION_NONE = 0
NVML_GPU_INSTANCE_PROFILE_COUNT = 18
"""As recent bindings name it; a driver that knows only 15 indices answers Invalid Argument past them."""
DRIVER_GPU_INSTANCE_PROFILES = 15
NVML_GPU_RECOVERY_ACTION_GPU_RESET = 1
NVML_GPU_RECOVERY_ACTION_NODE_REBOOT = 2

NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4

NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16


class NVMLError(Exception):
    """Same contract as pynvml.NVMLError: NVMLError(code) is an instance of the code's subclass."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        # The real bindings ask the library (nvmlErrorString) for codes outside the table.
        return NVMLError._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _extract_errors_as_classes() -> None:
    """pynvml's rule: NVML_ERROR_ALREADY_INITIALIZED becomes NVMLError_AlreadyInitialized."""
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        code = getattr(module, name)

        def make_new(code: int) -> Any:
            def new(cls: type[NVMLError], *args: object) -> NVMLError:
                obj = Exception.__new__(cls)
                obj.value = code
                return obj

            return new

        subclass = type(class_name, (NVMLError,), {"__new__": make_new(code)})
        subclass.__module__ = __name__
        setattr(module, class_name, subclass)
        NVMLError._valClassMapping[code] = subclass


_extract_errors_as_classes()


class c_nvmlMemory_t(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class c_nvmlMemory_v2_t(Structure):
    _fields_ = [
        ("version", c_uint),
        ("total", c_ulonglong),
        ("reserved", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    ]


nvmlMemory_v2 = 0x02000028


class nvmlPciInfo_t(Structure):
    _fields_ = [
        ("busIdLegacy", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class nvmlPciInfo_v2_t(Structure):
    """What bindings before NVML 9.0 returned: a 16-byte busId in the legacy 4-digit-domain format."""

    _fields_ = [
        ("busId", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("reserved0", c_uint),
        ("reserved1", c_uint),
        ("reserved2", c_uint),
        ("reserved3", c_uint),
    ]


class c_nvmlValue_t(Union):
    _fields_ = [
        ("dVal", c_double),
        ("uiVal", c_uint),
        ("ulVal", c_ulong),
        ("ullVal", c_ulonglong),
        ("sllVal", c_longlong),
        ("siVal", c_int),
        ("usVal", c_ushort),
    ]


class c_nvmlFieldValue_t(Structure):
    _fields_ = [
        ("fieldId", c_uint32),
        ("scopeId", c_uint32),
        ("timestamp", c_int64),
        ("latencyUsec", c_int64),
        ("valueType", c_uint),
        ("nvmlReturn", c_uint),
        ("value", c_nvmlValue_t),
    ]


class FakeHandle:
    """Opaque like c_nvmlDevice_t: only the fake knows which GPU it points at."""

    def __init__(self, position: int) -> None:
        self._position = position


@dataclass
class FakeEventData:
    """Fields of c_nvmlEventData_t; device is a handle, as in the real structure."""

    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeMigDevice:
    """A MIG device of a GPU in MIG mode (a compute instance spanning its GPU instance), as NVML lists it."""

    uuid: str
    profile: str
    """As NVML names the device after the GPU's name: `<GPU> MIG 1g.10gb`."""
    profile_id: int
    start: int
    size: int
    gi_id: int
    ci_id: int = 0
    memory_total: int = 9984 * MiB


class FakeMigHandle:
    """Opaque like a MIG device's c_nvmlDevice_t."""

    def __init__(self, parent: FakeHandle, index: int) -> None:
        self.parent = parent
        self.index = index


@dataclass
class FakeGpuInstanceInfo:
    """nvmlGpuInstanceInfo_t: the fields the driver reads (placement as a nested start/size)."""

    id: int
    profileId: int
    placement: Any


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    minor: int | None = None
    """None: the minor number equals the index."""
    memory_total: int = 81559 * MiB
    pci_bus_id: str = "00000000:18:00.0"
    architecture: int = NVML_DEVICE_ARCH_HOPPER
    compute_capability: tuple[int, int] = (9, 0)
    mig_mode: tuple[int, int] | None = (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_DISABLE)
    """None: the board has no MIG (the query answers Not Supported)."""
    mig_devices: list[FakeMigDevice] = field(default_factory=list)
    """The MIG devices that exist (only while MIG mode is on)."""
    max_mig_devices: int = 7
    gi_profiles: dict[int, tuple[int, int]] = field(default_factory=dict)
    """GPU-instance profile index -> (profile id, memorySizeMB), as nvmlDeviceGetGpuInstanceProfileInfo
    reports them; an index the board lacks answers Not Supported."""
    supported_events: int = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    """(corrected, uncorrected, pending, failure); None: no row remapping (pre-Ampere)."""
    recovery_action: int | None = NVML_GPU_RECOVERY_ACTION_NONE
    """None: the driver predates the recovery-action field."""
    lost: bool = False
    """Fallen off the bus: every query on it answers GPU is lost."""
    errors: dict[str, int] = field(default_factory=dict)
    """Function name -> NVML error code this GPU answers to that function."""
    # --- per-process figures (see the block at the end of this file) ---
    processes: dict[int, int | None] = field(default_factory=dict)
    """Running compute processes: host pid -> used GPU memory in bytes (None: not available)."""
    utilization: list[tuple[int, int, int, int]] = field(default_factory=list)
    """Per-process utilization samples, as the driver keeps them: (pid, timeStamp us, smUtil, memUtil)."""
    runs_on_cpu: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Real processes whose GPU work is their CPU time: pid -> (CPU ticks, monotonic us) at their last
    sample ((0, 0): since the process started). At each utilization query the driver appends a sample per
    such process, its smUtil what the process really ran since its previous one (a frozen or stopped
    process runs nothing)."""


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)
    queue: deque[FakeEventData] = field(default_factory=deque)
    freed: bool = False


@dataclass
class FakeDriver:
    gpus: list[FakeGpu]
    driver_version: str = "580.95.05"
    cuda_version: int = 13000
    init_error: int | None = None
    missing: set[str] = field(default_factory=set)
    """Functions this driver's libnvidia-ml lacks: they answer Function Not Found."""
    strings_as_bytes: bool = False
    """Bindings before 11.x returned bytes where today's return str."""
    legacy_pci_info: bool = False
    refcount: int = 0
    calls: list[str] = field(default_factory=list)
    event_sets: list[_EventSet] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    waiting: threading.Event = field(default_factory=threading.Event)
    """Set while a thread is blocked in nvmlEventSetWait, so a test can act during the wait."""
    handles: list[FakeHandle] = field(default_factory=list)
    process_dir: str | None = None
    """The fake CUDA driver's process files (FAKE_CUDA_PROCESS_DIR, native/limiter/tests/fake/fake_processes.h):
    every live process there holding memory on a GPU is one of its running compute processes, its memory
    and its kernel time what the fake driver says it holds and ran."""

    def __post_init__(self) -> None:
        self.handles = [FakeHandle(i) for i in range(len(self.gpus))]

    def inject_xid(self, position: int, xid: int) -> None:
        """The kernel driver reports an XID on this GPU: every event set watching it gets the event."""
        with self.cond:
            for event_set in self.event_sets:
                if event_set.registered.get(position, 0) & nvmlEventTypeXidCriticalError:
                    event_set.queue.append(
                        FakeEventData(self.handles[position], nvmlEventTypeXidCriticalError, xid)
                    )
            self.cond.notify_all()


_driver: FakeDriver | None = None


def install(driver: FakeDriver | None) -> None:
    """Make `driver` the machine's GPUs; None is a machine without the NVIDIA driver."""
    global _driver
    _driver = driver


def _enter(function: str) -> FakeDriver:
    if _driver is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _driver.calls.append(function)
    if _driver.refcount == 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    if function in _driver.missing:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    return _driver


def _gpu(function: str, handle: FakeHandle) -> FakeGpu:
    driver = _enter(function)
    gpu = driver.gpus[handle._position]
    if gpu.lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    if function in gpu.errors:
        raise NVMLError(gpu.errors[function])
    return gpu


def _str(text: str) -> str | bytes:
    return text.encode() if _driver is not None and _driver.strings_as_bytes else text


def nvmlInitWithFlags(flags: int) -> None:
    if _driver is None:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    _driver.calls.append("nvmlInit")
    if _driver.init_error is not None:
        raise NVMLError(_driver.init_error)
    _driver.refcount += 1


def nvmlInit() -> None:
    nvmlInitWithFlags(0)


def nvmlShutdown() -> None:
    driver = _enter("nvmlShutdown")
    driver.refcount -= 1


def nvmlErrorString(result: int) -> str:
    return NVMLError._errcode_to_string.get(result, "Unknown Error")


def nvmlSystemGetDriverVersion() -> str | bytes:
    driver = _enter("nvmlSystemGetDriverVersion")
    return _str(driver.driver_version)


def nvmlSystemGetCudaDriverVersion() -> int:
    return _enter("nvmlSystemGetCudaDriverVersion").cuda_version


def nvmlSystemGetCudaDriverVersion_v2() -> int:
    return _enter("nvmlSystemGetCudaDriverVersion_v2").cuda_version


def nvmlDeviceGetCount() -> int:
    return len(_enter("nvmlDeviceGetCount").gpus)


def nvmlDeviceGetHandleByIndex(index: int) -> FakeHandle:
    driver = _enter("nvmlDeviceGetHandleByIndex")
    if not 0 <= index < len(driver.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if driver.gpus[index].lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return driver.handles[index]


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> FakeHandle:
    driver = _enter("nvmlDeviceGetHandleByUUID")
    wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
    for position, gpu in enumerate(driver.gpus):
        if gpu.uuid == wanted:
            return driver.handles[position]
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def _mig(function: str, handle: FakeMigHandle) -> tuple[FakeGpu, FakeMigDevice]:
    gpu = _gpu(function, handle.parent)
    return gpu, gpu.mig_devices[handle.index]


def nvmlDeviceGetUUID(handle: FakeHandle | FakeMigHandle) -> str | bytes:
    if isinstance(handle, FakeMigHandle):
        return _str(_mig("nvmlDeviceGetUUID", handle)[1].uuid)
    gpu = _gpu("nvmlDeviceGetUUID", handle)
    return _str(gpu.uuid)


def nvmlDeviceGetIndex(handle: FakeHandle) -> int:
    _gpu("nvmlDeviceGetIndex", handle)
    return handle._position


def nvmlDeviceGetMinorNumber(handle: FakeHandle) -> int:
    gpu = _gpu("nvmlDeviceGetMinorNumber", handle)
    return handle._position if gpu.minor is None else gpu.minor


def nvmlDeviceGetName(handle: FakeHandle | FakeMigHandle) -> str | bytes:
    if isinstance(handle, FakeMigHandle):
        gpu, mig = _mig("nvmlDeviceGetName", handle)
        return _str(f"{gpu.name} MIG {mig.profile}")
    gpu = _gpu("nvmlDeviceGetName", handle)
    return _str(gpu.name)


def nvmlDeviceGetArchitecture(device: FakeHandle) -> int:
    return _gpu("nvmlDeviceGetArchitecture", device).architecture


def nvmlDeviceGetCudaComputeCapability(handle: FakeHandle) -> tuple[int, int]:
    return _gpu("nvmlDeviceGetCudaComputeCapability", handle).compute_capability


def nvmlDeviceGetMemoryInfo(
    handle: FakeHandle | FakeMigHandle, version: int | None = None
) -> c_nvmlMemory_t | c_nvmlMemory_v2_t:
    """Like the bindings: no version calls the v1 symbol, a version the v2 one (driver-reserved memory apart)."""
    if isinstance(handle, FakeMigHandle):
        _, mig = _mig("nvmlDeviceGetMemoryInfo", handle)
        return c_nvmlMemory_t(mig.memory_total, mig.memory_total, 0)
    if not version:
        gpu = _gpu("nvmlDeviceGetMemoryInfo", handle)
        return c_nvmlMemory_t(gpu.memory_total, gpu.memory_total - 512 * MiB, 512 * MiB)
    gpu = _gpu("nvmlDeviceGetMemoryInfo_v2", handle)
    reserved = 400 * MiB
    return c_nvmlMemory_v2_t(
        version, gpu.memory_total, reserved, gpu.memory_total - reserved - 512 * MiB, 512 * MiB
    )


def nvmlDeviceGetPciInfo(handle: FakeHandle) -> nvmlPciInfo_t | nvmlPciInfo_v2_t:
    gpu = _gpu("nvmlDeviceGetPciInfo", handle)
    domain_text, bus_text, rest = gpu.pci_bus_id.split(":")
    domain, bus, device = int(domain_text, 16), int(bus_text, 16), int(rest.split(".")[0], 16)
    if _driver is not None and _driver.legacy_pci_info:
        legacy = f"{domain:04X}:{bus:02X}:{device:02X}.0".encode()
        return nvmlPciInfo_v2_t(legacy, domain, bus, device, 0x233010DE, 0x16C110DE)
    info = nvmlPciInfo_t()
    info.busIdLegacy = f"{domain:04X}:{bus:02X}:{device:02X}.0".encode()
    info.domain, info.bus, info.device = domain, bus, device
    info.pciDeviceId, info.pciSubSystemId = 0x233010DE, 0x16C110DE
    info.busId = gpu.pci_bus_id.encode()
    return info


def nvmlDeviceGetMigMode(device: FakeHandle) -> list[int]:
    gpu = _gpu("nvmlDeviceGetMigMode", device)
    if gpu.mig_mode is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return list(gpu.mig_mode)


def _mig_on(function: str, device: FakeHandle) -> FakeGpu:
    gpu = _gpu(function, device)
    if gpu.mig_mode is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu


@dataclass
class FakeGpuInstanceProfileInfo:
    """nvmlGpuInstanceProfileInfo_v2_t: the fields the driver reads."""

    id: int
    memorySizeMB: int


def nvmlDeviceGetGpuInstanceProfileInfo(device: FakeHandle, profile: int, version: int = 2) -> Any:
    gpu = _mig_on("nvmlDeviceGetGpuInstanceProfileInfo", device)
    if not 0 <= profile < DRIVER_GPU_INSTANCE_PROFILES:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if profile not in gpu.gi_profiles:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return FakeGpuInstanceProfileInfo(*gpu.gi_profiles[profile])


def nvmlDeviceGetMaxMigDeviceCount(device: FakeHandle) -> int:
    return _mig_on("nvmlDeviceGetMaxMigDeviceCount", device).max_mig_devices


def nvmlDeviceGetMigDeviceHandleByIndex(device: FakeHandle, index: int) -> FakeMigHandle:
    """Invalid Argument past the GPU's maximum; Not Found for an index without a MIG device (MIG off: none)."""
    gpu = _mig_on("nvmlDeviceGetMigDeviceHandleByIndex", device)
    if not 0 <= index < gpu.max_mig_devices:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if gpu.mig_mode[0] != NVML_DEVICE_MIG_ENABLE or index >= len(gpu.mig_devices):  # type: ignore[index]
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return FakeMigHandle(device, index)


def nvmlDeviceGetGpuInstanceId(device: FakeHandle | FakeMigHandle) -> int:
    if not isinstance(device, FakeMigHandle):
        _gpu("nvmlDeviceGetGpuInstanceId", device)
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # not a MIG device
    return _mig("nvmlDeviceGetGpuInstanceId", device)[1].gi_id


def nvmlDeviceGetComputeInstanceId(device: FakeHandle | FakeMigHandle) -> int:
    if not isinstance(device, FakeMigHandle):
        _gpu("nvmlDeviceGetComputeInstanceId", device)
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _mig("nvmlDeviceGetComputeInstanceId", device)[1].ci_id


def nvmlDeviceGetGpuInstanceById(device: FakeHandle, gpuInstanceId: int) -> tuple[FakeHandle, int]:
    gpu = _mig_on("nvmlDeviceGetGpuInstanceById", device)
    if not any(m.gi_id == gpuInstanceId for m in gpu.mig_devices):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return (device, gpuInstanceId)


def nvmlGpuInstanceGetInfo(gpuInstance: tuple[FakeHandle, int]) -> FakeGpuInstanceInfo:
    device, gi_id = gpuInstance
    gpu = _mig_on("nvmlGpuInstanceGetInfo", device)
    mig = next(m for m in gpu.mig_devices if m.gi_id == gi_id)
    placement = type("nvmlGpuInstancePlacement_t", (), {"start": mig.start, "size": mig.size})()
    return FakeGpuInstanceInfo(gi_id, mig.profile_id, placement)


def nvmlDeviceGetRemappedRows(device: FakeHandle) -> tuple[int, int, int, int]:
    gpu = _gpu("nvmlDeviceGetRemappedRows", device)
    if gpu.remapped_rows is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu.remapped_rows


def nvmlDeviceGetFieldValues(handle: FakeHandle, fieldIds: list[int]) -> Any:
    """Per-field status as NVML reports it: the call succeeds, a field it lacks has nvmlReturn set."""
    gpu = _gpu("nvmlDeviceGetFieldValues", handle)
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    for i, field_id in enumerate(fieldIds):
        values[i].fieldId = field_id
        if field_id == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and gpu.recovery_action is not None:
            values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT
            values[i].value.uiVal = gpu.recovery_action
            values[i].nvmlReturn = NVML_SUCCESS
        else:
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED
    return values


def nvmlDeviceGetSupportedEventTypes(handle: FakeHandle) -> int:
    return _gpu("nvmlDeviceGetSupportedEventTypes", handle).supported_events


def nvmlEventSetCreate() -> _EventSet:
    driver = _enter("nvmlEventSetCreate")
    event_set = _EventSet()
    with driver.cond:
        driver.event_sets.append(event_set)
    return event_set


def nvmlDeviceRegisterEvents(handle: FakeHandle, eventTypes: int, eventSet: _EventSet) -> None:
    gpu = _gpu("nvmlDeviceRegisterEvents", handle)
    if eventTypes & ~gpu.supported_events:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    eventSet.registered[handle._position] = eventSet.registered.get(handle._position, 0) | eventTypes


def nvmlEventSetWait_v2(eventSet: _EventSet, timeoutms: int) -> FakeEventData:
    driver = _enter("nvmlEventSetWait_v2")
    with driver.cond:
        if eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        driver.waiting.set()
        try:
            driver.cond.wait_for(lambda: bool(eventSet.queue), timeout=timeoutms / 1000)
        finally:
            driver.waiting.clear()
        if not eventSet.queue:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return eventSet.queue.popleft()


def nvmlEventSetWait(eventSet: _EventSet, timeoutms: int) -> FakeEventData:
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet: _EventSet) -> None:
    driver = _enter("nvmlEventSetFree")
    with driver.cond:
        eventSet.freed = True
        driver.event_sets.remove(eventSet)


# ==== NVML 615 per-cgroup memory limits (nvmlDeviceSetMemoryLimits_v1 / GetMemoryLimits_v1) ====
# Semantics from the NVML reference (structs nvmlSetMemoryLimits_v1_t / nvmlGetMemoryLimits_v1_t) and
# NVIDIA's MPS v3 memory-partitioning guide:
# - absent from drivers before 615: Function Not Found (pynvml's lookup raises exactly that);
# - Set needs root ("Requires root/admin permissions"): No Permission otherwise; Get does not;
# - MIG handles are not supported: Not Supported on a GPU in MIG mode;
# - nameSpace is a cgroup-v2 directory; a path that is not one is Invalid Argument (unverified code);
# - soft above hard, or a hard limit above the GPU's memory (other than the "none" value), is
#   Invalid Argument (unverified code);
# - clear = soft 0, hard NVML_DEVICE_MEMORY_LIMIT_MAX; no limit reads back as (0, MAX);
# - backend "dmem": the leaf's dmem.max / dmem.min carry hard / soft and the soft limit is added to
#   every ancestor's dmem.min (removing the leaf does not take it back); a leaf without dmem files
#   (controller not delegated) is Not Supported (unverified code). Backend "misc": driver-internal,
#   no files. The region name `nvidia/<pci bus id>` is this fake's; the real name is unverified.
# A hook process loads this module by name (DRA_GPU_NVML_MODULE) and gets its GPUs from the JSON file
# named by FAKE_NVML_CONFIG; each successful Set is appended to the config's "log" file as JSON.

import json as _json  # noqa: E402
import os as _os  # noqa: E402
from pathlib import Path as _Path  # noqa: E402

NVML_DEVICE_MEMORY_LIMIT_MAX = 0xFFFFFFFFFFFFFFFF
MEMORY_LIMITS_MIN_MAJOR = 615


@dataclass
class MemoryLimitState:
    backend: str = "dmem"
    privileged: bool = True
    cgroup_root: str = "/sys/fs/cgroup"
    log: str | None = None
    limits: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    """(gpu uuid, cgroup dir) -> (soft, hard)."""


memory_limits = MemoryLimitState()


def _region(gpu: FakeGpu) -> str:
    return f"nvidia/{gpu.pci_bus_id}"


def _dmem_write(path: _Path, region: str, value: str) -> None:
    lines = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, _, val = line.rpartition(" ")
            lines[key] = val
    lines[region] = value
    path.write_text("".join(f"{k} {v}\n" for k, v in lines.items()))


def _dmem_read(path: _Path, region: str) -> int:
    for line in path.read_text().splitlines() if path.exists() else []:
        key, _, val = line.rpartition(" ")
        if key == region and val.isdigit():
            return int(val)
    return 0


def _limits_entry(function: str, device: FakeHandle) -> tuple[FakeDriver, FakeGpu]:
    driver = _enter(function)
    major = int(driver.driver_version.split(".")[0])
    if major < MEMORY_LIMITS_MIN_MAJOR:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    gpu = _gpu(function, device)
    if gpu.mig_mode is not None and gpu.mig_mode[0] == NVML_DEVICE_MIG_ENABLE:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return driver, gpu


def _cgroup_dir(name_space: Any) -> _Path:
    text = name_space.decode() if isinstance(name_space, bytes) else str(name_space or "")
    path = _Path(text)
    if not text or not (path / "cgroup.controllers").is_file():
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return path


def nvmlDeviceSetMemoryLimits_v1(device: FakeHandle, limits: Any) -> None:
    _driver, gpu = _limits_entry("nvmlDeviceSetMemoryLimits_v1", device)
    if not memory_limits.privileged:
        raise NVMLError(NVML_ERROR_NO_PERMISSION)
    leaf = _cgroup_dir(limits.nameSpace)
    soft, hard = int(limits.softLimit), int(limits.hardLimit)
    if soft > hard or (hard != NVML_DEVICE_MEMORY_LIMIT_MAX and hard > gpu.memory_total):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    key = (gpu.uuid, str(leaf))
    old_soft = memory_limits.limits.get(key, (0, 0))[0]
    if memory_limits.backend == "dmem":
        if not (leaf / "dmem.max").exists():
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        region = _region(gpu)
        _dmem_write(leaf / "dmem.max", region, "max" if hard == NVML_DEVICE_MEMORY_LIMIT_MAX else str(hard))
        _dmem_write(leaf / "dmem.min", region, str(soft))
        root = _Path(memory_limits.cgroup_root)
        parent = leaf.parent
        while parent != root and root in parent.parents:
            if (parent / "dmem.min").exists():
                value = _dmem_read(parent / "dmem.min", region) + soft - old_soft
                _dmem_write(parent / "dmem.min", region, str(max(value, 0)))
            parent = parent.parent
    if soft == 0 and hard == NVML_DEVICE_MEMORY_LIMIT_MAX:
        memory_limits.limits.pop(key, None)
    else:
        memory_limits.limits[key] = (soft, hard)
    if memory_limits.log:
        with open(memory_limits.log, "a") as out:
            out.write(_json.dumps({"uuid": gpu.uuid, "cgroup": str(leaf), "soft": soft, "hard": hard}) + "\n")


def nvmlDeviceGetMemoryLimits_v1(device: FakeHandle, limits: Any) -> None:
    _driver, gpu = _limits_entry("nvmlDeviceGetMemoryLimits_v1", device)
    leaf = _cgroup_dir(limits.nameSpace)
    soft, hard = memory_limits.limits.get((gpu.uuid, str(leaf)), (0, NVML_DEVICE_MEMORY_LIMIT_MAX))
    limits.softLimit, limits.hardLimit, limits.currentUsed = soft, hard, 0


def _install_from_environment() -> None:
    """A hook process: the GPUs and memory-limit state from the JSON file in FAKE_NVML_CONFIG."""
    global memory_limits
    path = _os.environ.get("FAKE_NVML_CONFIG")
    if not path:
        return
    config = _json.loads(_Path(path).read_text())
    mig_on = (NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE)
    gpus = [
        FakeGpu(
            uuid=g["uuid"],
            pci_bus_id=g.get("pci_bus_id", f"00000000:{0x18 + i:02x}:00.0"),
            memory_total=int(g.get("memory_total", 81559 * MiB)),
            mig_mode=mig_on if g.get("mig") else (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_DISABLE),
        )
        for i, g in enumerate(config["gpus"])
    ]
    install(FakeDriver(gpus=gpus, driver_version=config.get("driver_version", "615.71.09")))
    memory_limits = MemoryLimitState(
        backend=config.get("backend", "dmem"),
        privileged=bool(config.get("privileged", True)),
        cgroup_root=config.get("cgroup_root", "/sys/fs/cgroup"),
        log=config.get("log"),
    )


_install_from_environment()

# --- per-process memory and utilization -----------------------------------------------------------
# What the bindings return, not the C calls beneath them: the bindings size the arrays themselves
# (the C calls' NVML_ERROR_INSUFFICIENT_SIZE never reaches Python), an empty process list is [], a
# process whose memory the driver cannot tell has usedGpuMemory None, and the utilization queries
# raise NVML_ERROR_NOT_FOUND when the driver has no sample newer than the timestamp given.


class nvmlFriendlyObject:
    def __init__(self, dictionary: dict[str, Any]) -> None:
        for key, value in dictionary.items():
            setattr(self, key, value)


class c_nvmlProcessUtilizationSample_t(Structure):
    _fields_ = [
        ("pid", c_uint),
        ("timeStamp", c_ulonglong),
        ("smUtil", c_uint),
        ("memUtil", c_uint),
        ("encUtil", c_uint),
        ("decUtil", c_uint),
    ]


class c_nvmlProcessUtilizationInfo_v1_t(Structure):
    _fields_ = [
        ("timeStamp", c_ulonglong),
        ("pid", c_uint),
        ("smUtil", c_uint),
        ("memUtil", c_uint),
        ("encUtil", c_uint),
        ("decUtil", c_uint),
        ("jpgUtil", c_uint),
        ("ofaUtil", c_uint),
    ]


_PROCESS_HEAD = struct.Struct("=QIIQQ")
_PROCESS_DEVICE = struct.Struct("=48sQQQQ")
_PROCESS_MAGIC = 0x31434F5250414446


def published(directory: str | None) -> dict[int, dict[str, tuple[int, int, int]]]:
    """Live processes of the fake driver: pid -> uuid -> (bytes held, kernel ns run, when published, ns)."""
    out: dict[int, dict[str, tuple[int, int, int]]] = {}
    if not directory:
        return out
    try:
        names = [n for n in _os.listdir(directory) if n.isdigit()]
    except OSError:
        return out
    for name in names:
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue  # exited: the driver has torn its contexts down
            with open(f"{directory}/{name}", "rb") as f:
                data = f.read()
        except (OSError, IndexError):
            continue
        if len(data) < _PROCESS_HEAD.size:
            continue
        magic, pid, count, _seq, _ = _PROCESS_HEAD.unpack_from(data)
        if magic != _PROCESS_MAGIC or pid != int(name):
            continue
        devices = {}
        for i in range(min(count, 8)):
            uuid, used, busy, at, _ = _PROCESS_DEVICE.unpack_from(
                data, _PROCESS_HEAD.size + i * _PROCESS_DEVICE.size
            )
            devices[uuid.split(b"\0", 1)[0].decode()] = (used, busy, at)
        out[pid] = devices
    return out


def _published_on(gpu: FakeGpu) -> dict[int, tuple[int, int, int]]:
    driver = _driver
    if driver is None or driver.process_dir is None:
        return {}
    return {
        pid: figures[gpu.uuid]
        for pid, figures in published(driver.process_dir).items()
        if gpu.uuid in figures and figures[gpu.uuid][0] > 0
    }


def _running(function: str, handle: FakeHandle) -> list[nvmlFriendlyObject]:
    gpu = _gpu(function, handle)
    processes = dict(gpu.processes)
    processes.update({pid: figures[0] for pid, figures in _published_on(gpu).items()})
    return [
        nvmlFriendlyObject(
            {"pid": pid, "usedGpuMemory": used, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
        )
        for pid, used in processes.items()
    ]


def nvmlDeviceGetComputeRunningProcesses_v3(handle: FakeHandle) -> list[nvmlFriendlyObject]:
    return _running("nvmlDeviceGetComputeRunningProcesses_v3", handle)


def nvmlDeviceGetComputeRunningProcesses_v2(handle: FakeHandle) -> list[nvmlFriendlyObject]:
    return _running("nvmlDeviceGetComputeRunningProcesses_v2", handle)


def nvmlDeviceGetComputeRunningProcesses(handle: FakeHandle) -> list[nvmlFriendlyObject]:
    return nvmlDeviceGetComputeRunningProcesses_v3(handle)


def _cpu_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime


def _age_s(pid: int) -> float:
    """Seconds since the process started (`stat` field 22, clock ticks since boot)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            start = int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0.0
    return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start / _os.sysconf("SC_CLK_TCK"))


def _sample_cpu_runners(gpu: FakeGpu) -> None:
    """The driver samples each process's utilization on its own clock; here, when asked."""
    now_us = time.monotonic_ns() // 1000
    hz = _os.sysconf("SC_CLK_TCK")
    for pid, (ticks, at) in list(gpu.runs_on_cpu.items()):
        current = _cpu_ticks(pid)
        if current is None:
            del gpu.runs_on_cpu[pid]
            continue
        if not at:  # first seen: the driver has sampled it since it started
            ticks, at = 0, now_us - int(_age_s(pid) * 1e6)
        if now_us <= at:
            continue
        share = (current - ticks) / hz / ((now_us - at) / 1e6)
        gpu.runs_on_cpu[pid] = (current, now_us)
        gpu.utilization.append((pid, now_us, min(100, round(share * 100)), 0))
    del gpu.utilization[:-1000]  # the driver keeps a ring of recent samples


_last_published: dict[tuple[str, int], tuple[int, int]] = {}
"""(gpu uuid, pid) -> (kernel ns, ns) of the fake driver's process at its last sample."""


def _sample_published(gpu: FakeGpu) -> None:
    """A sample per process of the fake driver that published since its last: the share of the time between
    that it ran kernels, stamped with when the driver published it."""
    for pid, (_used, busy, at) in _published_on(gpu).items():
        last = _last_published.get((gpu.uuid, pid))
        _last_published[(gpu.uuid, pid)] = (busy, at)
        if last is not None and at > last[1]:
            share = (busy - last[0]) / (at - last[1])
            gpu.utilization.append((pid, at // 1000, min(100, round(share * 100)), 0))


def _samples(function: str, handle: FakeHandle, timeStamp: int) -> list[tuple[int, int, int, int]]:
    gpu = _gpu(function, handle)
    _sample_cpu_runners(gpu)
    _sample_published(gpu)
    newer = [s for s in list(gpu.utilization) if s[1] > timeStamp]
    if not newer:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return newer


def nvmlDeviceGetProcessUtilization(handle: FakeHandle, timeStamp: int) -> list[Any]:
    return [
        c_nvmlProcessUtilizationSample_t(pid, ts, sm, mem, 0, 0)
        for pid, ts, sm, mem in _samples("nvmlDeviceGetProcessUtilization", handle, timeStamp)
    ]


def nvmlDeviceGetProcessesUtilizationInfo(handle: FakeHandle, timeStamp: int) -> list[Any]:
    return [
        c_nvmlProcessUtilizationInfo_v1_t(ts, pid, sm, mem, 0, 0, 0, 0)
        for pid, ts, sm, mem in _samples("nvmlDeviceGetProcessesUtilizationInfo", handle, timeStamp)
    ]
