"""The node's real GPUs, read through NVML (the nvidia-ml-py bindings, imported as pynvml).

pynvml is imported only when this backend is opened, so that simulated nodes and the tests run
where no NVIDIA library exists. Every NVML failure leaves this module as an InventoryError that
names the NVML error, because "Not Supported" alone does not tell an operator which call failed.
Bindings and drivers differ in age: strings may come back as bytes, functions may be missing from
the bindings (AttributeError) or from the driver (NVML_ERROR_FUNCTION_NOT_FOUND); each such gap
has a fallback instead of a failure.

Longer than 500 lines: each NVML query sits beside its fallback for older bindings and drivers; split, a fallback
would be apart from the call it stands in for.
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
from dataclasses import replace
from typing import Any

from dra_gpu.inventory.arch import (
    UNKNOWN,
    architecture_from_code,
    architecture_from_compute_capability,
    compute_capability_from_name,
)
from dra_gpu.inventory.capabilities import CgroupLayout, detect, read_cgroup_layout, with_capabilities
from dra_gpu.inventory.mig import MigInstance
from dra_gpu.inventory.mig_profiles import table_for
from dra_gpu.inventory.types import GpuInfo, InventoryError, NvmlUnavailableError
from dra_gpu.inventory.xid import describe_recovery_action, describe_xid, xid_is_fatal

log = logging.getLogger(__name__)

# nvmlReturn_t values, from nvml.h (a stable ABI); names come from the bindings when they have them.
_SUCCESS = 0
_NO_PERMISSION = 4
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_TIMEOUT = 10
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_LIB_RM_VERSION_MISMATCH = 18
_GPU_NOT_FOUND = 28
_UNKNOWN = 999
_INVALID_ARGUMENT = 2
_ABSENT = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
"""The driver or the board does not have this query: use a fallback, not an error."""
_LOST = frozenset({_GPU_IS_LOST, _RESET_REQUIRED, _GPU_NOT_FOUND, _UNKNOWN})

_GPU_INSTANCE_PROFILE_COUNT = 15
"""NVML_GPU_INSTANCE_PROFILE_COUNT of older bindings; newer ones name more indices (asked if present)."""

_EVENT_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
_FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

_INIT_HINTS = {
    _LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 was not found (install the NVIDIA driver, "
    "or mount the driver's library directory into this container)",
    _DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded on this machine",
    _NO_PERMISSION: "this process may not open the GPU device nodes (/dev/nvidia*)",
    _LIB_RM_VERSION_MISMATCH: "the NVML library and the loaded kernel driver are different versions; "
    "reload the driver or reboot after a driver upgrade",
}

_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def _import_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError as err:
        raise NvmlUnavailableError(
            f"NVML is not available: the pynvml module (package nvidia-ml-py) cannot be imported: {err}"
        ) from err


def _text(value: object) -> str:
    """Old bindings return bytes, new ones str; fixed-size C buffers may carry trailing NULs."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00").strip()
    return str(value).rstrip("\x00").strip()


def normalize_pci_bus_id(text: str) -> str | None:
    """NVML's "00000000:18:00.0" as Kubernetes' pciBusID wants it: "0000:18:00.0", lower case.

    A domain above 0xffff (VMD) keeps all eight digits: it cannot be shortened without lying.
    """
    match = _BUS_ID.match(text.strip())
    if match is None:
        return None
    domain, bus, device, function = (int(group, 16) for group in match.groups())
    width = 4 if domain <= 0xFFFF else 8
    return f"{domain:0{width}x}:{bus:02x}:{device:02x}.{function}"


def format_cuda_version(version: int) -> str:
    """NVML's 13000 or 12040 as "13.0" or "12.4" (the encoding is major*1000 + minor*10)."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _field_int(field: Any) -> int:
    """The integer in an nvmlFieldValue_t, whichever member of the value union NVML filled."""
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
        int(field.valueType), "ullVal"
    )
    return int(getattr(field.value, member))


def _mig_profile(mig_name: str, parent_name: str, profile_id: int) -> str:
    """A MIG device's profile as nvidia-smi prints it (`1g.10gb`): NVML names the device `<GPU> MIG 1g.10gb`;
    failing that, the profile table's name for the GPU-instance profile id."""
    if " MIG " in mig_name:
        return mig_name.rsplit(" MIG ", 1)[1].strip().lower()
    table = table_for(parent_name, 0)
    profile = next((p for p in table.profiles if p.profile_id == profile_id), None) if table else None
    return profile.name if profile else f"profile-{profile_id}"


class NvmlInventory:
    """GPUs as NVML reports them; health from device probes, row remapping and critical XID events.

    nvml is the pynvml module; tests pass a fake with the same functions and error classes.
    """

    backend = "nvml"

    def __init__(
        self,
        nvml: Any = None,
        cgroup_layout: CgroupLayout | None = None,
        hook_problem: str = "",
        mig_dynamic: bool = False,
    ) -> None:
        self._nvml = nvml if nvml is not None else _import_pynvml()
        self._mig_dynamic = mig_dynamic
        """The node lets the driver make instances on a MIG GPU that has none (`--mig-dynamic`)."""
        self._cgroup_layout = cgroup_layout if cgroup_layout is not None else read_cgroup_layout()
        self._hook_problem = hook_problem
        """Why the node has no usable memory-limit hook ("" if it has one; see capabilities.detect)."""
        self._error_names = {
            value: name
            for name in dir(self._nvml)
            if name.startswith("NVML_ERROR_") and isinstance(value := getattr(self._nvml, name), int)
        }
        self._lock = threading.RLock()
        self._closed = False
        self._handles: dict[str, Any] = {}
        self._xids: dict[str, int] = {}
        """Fatal XIDs by GPU UUID, kept until the driver says no recovery action is needed."""
        self._event_set: Any = None
        self._events_registered = 0
        self._events_tried = False
        self._waiting = 0
        self._shut_down = False
        self._stop = threading.Event()
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as err:
            hint = _INIT_HINTS.get(self._code(err), "check that the NVIDIA driver works (nvidia-smi)")
            raise NvmlUnavailableError(f"NVML is not available: {self._describe(err)}; {hint}") from err
        try:
            self._static = self._read_all()
            self._gpus = self._with_health(self._static)
        except BaseException:
            self._shutdown()
            raise

    # -- errors -------------------------------------------------------------------------------

    @staticmethod
    def _code(err: BaseException) -> int:
        value = getattr(err, "value", _UNKNOWN)
        return value if isinstance(value, int) else _UNKNOWN

    def _describe(self, err: BaseException) -> str:
        code = self._code(err)
        return f"{err} ({self._error_names.get(code, f'NVML error {code}')})"

    def _error(self, what: str, err: BaseException) -> InventoryError:
        return InventoryError(f"NVML failed while {what}: {self._describe(err)}")

    def _optional(self, function: str, *args: Any) -> Any:
        """Call an NVML query that old drivers or some boards lack; None where it is absent."""
        fn = getattr(self._nvml, function, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            if self._code(err) in _ABSENT:
                return None
            raise

    # -- static facts -------------------------------------------------------------------------

    def _read_all(self) -> list[GpuInfo]:
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            cuda = self._optional("nvmlSystemGetCudaDriverVersion_v2")
            if cuda is None:
                cuda = self._optional("nvmlSystemGetCudaDriverVersion")
        except nvml.NVMLError as err:
            raise self._error("reading the GPU count and driver version", err) from err
        cuda_version = format_cuda_version(int(cuda)) if cuda else ""
        gpus: list[GpuInfo] = []
        for i in range(count):
            try:
                gpus.append(self._read_gpu(i, driver, cuda_version))
            except nvml.NVMLError as err:
                if self._code(err) not in _LOST:
                    raise self._error(f"reading GPU {i}", err) from err
                # A lost GPU has no readable identity: leave it out rather than take the node down.
                log.warning(
                    "GPU %d is unreachable and is left out of the inventory: %s",
                    i,
                    self._describe(err),
                    extra={"gpu_index": i},
                )
        return sorted(gpus, key=lambda gpu: gpu.index)

    def _read_gpu(self, position: int, driver: str, cuda_version: str) -> GpuInfo:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(position)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        index = self._optional("nvmlDeviceGetIndex", handle)
        index = position if index is None else int(index)
        minor = self._optional("nvmlDeviceGetMinorNumber", handle)
        name = _text(nvml.nvmlDeviceGetName(handle))
        cc = self._compute_capability(handle, name)
        mig_mode = self._optional("nvmlDeviceGetMigMode", handle)
        gpu = GpuInfo(
            index=index,
            minor=index if minor is None else int(minor),
            uuid=uuid,
            product_name=name,
            architecture=self._architecture(handle, cc),
            cuda_compute_capability=cc,
            memory_bytes=self._memory_total(handle),
            driver_version=driver,
            cuda_driver_version=cuda_version,
            pci_bus_id=self._pci_bus_id(handle, position),
            mig_capable=mig_mode is not None,
        )
        mig_enabled = mig_mode is not None and int(mig_mode[0]) == 1  # NVML_DEVICE_MIG_ENABLE
        if mig_mode is not None and int(mig_mode[1]) != int(mig_mode[0]):
            log.warning(
                "GPU %d has a MIG mode change pending (current %s, after a reset %s): it is published as it is now",
                index,
                "enabled" if mig_enabled else "disabled",
                "enabled" if int(mig_mode[1]) == 1 else "disabled",
                extra={"gpu_index": index},
            )
        instances = self._mig_instances(handle, uuid, name) if mig_enabled else ()
        gpu = with_capabilities(
            replace(
                gpu,
                mig_enabled=mig_enabled,
                mig_instances=instances,
                mig_dynamic=mig_enabled and not instances and self._mig_dynamic,
                mig_profile_memory=self._mig_profile_memory(handle) if mig_enabled else (),
            ),
            detect(driver, self._cgroup_layout, mig_enabled, self._hook_problem),
        )
        self._handles[uuid] = handle
        return gpu

    def _mig_instances(self, handle: Any, parent_uuid: str, parent_name: str) -> tuple[MigInstance, ...]:
        """The MIG devices (a compute instance each) that exist on a GPU in MIG mode, by placement."""
        nvml = self._nvml
        count = self._optional("nvmlDeviceGetMaxMigDeviceCount", handle)
        found: list[MigInstance] = []
        for i in range(int(count or 0)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except nvml.NVMLError as err:
                if self._code(err) == _NOT_FOUND:  # no MIG device at this index
                    continue
                raise
            gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
            info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id))
            found.append(
                MigInstance(
                    uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                    parent_uuid=parent_uuid,
                    profile=_mig_profile(
                        _text(nvml.nvmlDeviceGetName(mig)), parent_name, int(info.profileId)
                    ),
                    start=int(info.placement.start),
                    size=int(info.placement.size),
                    gi_id=gi_id,
                    ci_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
                    memory_bytes=self._memory_total(mig),
                )
            )
        return tuple(sorted(found, key=lambda m: (m.start, m.gi_id, m.ci_id)))

    def _mig_profile_memory(self, handle: Any) -> tuple[tuple[int, int], ...]:
        """(profile id, bytes) of each GPU-instance profile the GPU has, from NVML's profile info: what an
        instance will have once made, which dynamic placements publish (the name only rounds it)."""
        nvml = self._nvml
        count = int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", _GPU_INSTANCE_PROFILE_COUNT))
        found: dict[int, int] = {}
        for index in range(count):
            try:
                info = self._optional("nvmlDeviceGetGpuInstanceProfileInfo", handle, index)
            except nvml.NVMLError as err:
                if self._code(err) != _INVALID_ARGUMENT:  # an index this driver does not know
                    raise
                continue
            if info is not None and int(info.memorySizeMB) > 0:
                found[int(info.id)] = int(info.memorySizeMB) * 2**20
        return tuple(sorted(found.items()))

    def _memory_total(self, handle: Any) -> int:
        """The v1 memory query is deprecated; where a driver has dropped it, ask the v2 one."""
        nvml = self._nvml
        try:
            return int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        except nvml.NVMLError as err:
            version = getattr(nvml, "nvmlMemory_v2", None)
            if self._code(err) != _FUNCTION_NOT_FOUND or version is None:
                raise
            return int(nvml.nvmlDeviceGetMemoryInfo(handle, version=version).total)

    def _compute_capability(self, handle: Any, name: str) -> str:
        got = self._optional("nvmlDeviceGetCudaComputeCapability", handle)
        if got is None:
            return compute_capability_from_name(name)
        major, minor = got
        return f"{int(major)}.{int(minor)}"

    def _architecture(self, handle: Any, cc: str) -> str:
        code = self._optional("nvmlDeviceGetArchitecture", handle)
        named = architecture_from_code(int(code)) if code is not None else None
        if named:
            return named
        return architecture_from_compute_capability(cc) if cc else UNKNOWN

    def _pci_bus_id(self, handle: Any, position: int) -> str:
        info = self._nvml.nvmlDeviceGetPciInfo(handle)
        for field in ("busId", "busIdLegacy"):
            normalized = normalize_pci_bus_id(_text(getattr(info, field, b"")))
            if normalized:
                return normalized
        try:
            return normalize_pci_bus_id(f"{info.domain:x}:{info.bus:x}:{info.device:x}.0") or ""
        except (AttributeError, TypeError, ValueError) as err:
            raise InventoryError(f"NVML returned no usable PCI bus id for GPU {position}") from err

    # -- health -------------------------------------------------------------------------------

    def _health_reason(self, uuid: str) -> str:
        """Why this GPU is unhealthy right now; "" when it is healthy."""
        nvml = self._nvml
        handle = self._handles[uuid]
        try:
            self._memory_total(handle)
            rows = self._optional("nvmlDeviceGetRemappedRows", handle)
        except nvml.NVMLError as err:
            return f"NVML cannot query the GPU: {self._describe(err)}"
        if rows is not None:
            _corrected, _uncorrected, pending, failure = rows
            if failure:
                return "row remapping failed: memory errors exceed the spare rows; the GPU needs service"
            if pending:
                return "uncorrectable memory error: row remapping is pending until the GPU is reset"
        with self._lock:
            xid = self._xids.get(uuid)
        if xid is None:
            return ""
        action = self._recovery_action(handle)
        if action is None:
            return describe_xid(xid)
        if not xid_is_fatal(xid, action):
            with self._lock:
                self._xids.pop(uuid, None)
            log.info("GPU %s recovered from %s", uuid, describe_xid(xid), extra={"gpu_uuid": uuid})
            return ""
        return f"{describe_xid(xid)} (needs {describe_recovery_action(action)})"

    def _recovery_action(self, handle: Any) -> int | None:
        """What the driver says must happen before the GPU is usable; None where it cannot say."""
        field = getattr(self._nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", _FIELD_RECOVERY_ACTION)
        try:
            values = self._optional("nvmlDeviceGetFieldValues", handle, [field])
        except self._nvml.NVMLError:
            return None
        if not values or int(values[0].nvmlReturn) != _SUCCESS:
            return None
        return _field_int(values[0])

    def _with_health(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        result = []
        for gpu in gpus:
            reason = self._health_reason(gpu.uuid)
            result.append(replace(gpu, healthy=not reason, health_reason=reason))
        return result

    def gpus(self) -> list[GpuInfo]:
        with self._lock:
            return list(self._gpus)

    def refresh_health(self) -> list[GpuInfo]:
        """Probe every GPU; the first call also starts watching XID events (the health loop's start)."""
        with self._lock:
            if self._closed:
                raise InventoryError("the NVML inventory is closed")
            self._ensure_events()
            self._gpus = self._with_health(self._static)
            return list(self._gpus)

    def wait_health_event(self, timeout_s: float) -> bool:
        """Wait for a critical XID; at the timeout, probe so that loss and recovery count too.

        The NVML wait cannot be interrupted: keep timeout_s short (seconds) so that close() is prompt.
        """
        if self._closed:
            return False
        if self._ensure_events():
            if self._wait_xid(max(int(timeout_s * 1000), 0)):
                return True
        elif self._stop.wait(max(timeout_s, 0.0)):
            return False
        with self._lock:
            if self._closed:
                return False
            published = [(gpu.healthy, gpu.health_reason) for gpu in self._gpus]
            current = [(gpu.healthy, gpu.health_reason) for gpu in self._with_health(self._static)]
        return current != published

    def _ensure_events(self) -> bool:
        """Register every GPU for critical XID events once; False where none could be registered."""
        with self._lock:
            if self._events_tried:
                return self._events_registered > 0
            self._events_tried = True
            nvml = self._nvml
            try:
                event_set = self._optional("nvmlEventSetCreate")
            except nvml.NVMLError as err:
                log.warning("NVML events are unavailable, health is polled: %s", self._describe(err))
                return False
            if event_set is None:
                log.warning("NVML events are unavailable on this driver, health is polled")
                return False
            self._event_set = event_set
            for uuid, handle in self._handles.items():
                try:
                    supported = self._optional("nvmlDeviceGetSupportedEventTypes", handle)
                    if supported is not None and not int(supported) & _EVENT_XID_CRITICAL:
                        log.info("GPU %s reports no XID events; its health is polled", uuid)
                        continue
                    nvml.nvmlDeviceRegisterEvents(handle, _EVENT_XID_CRITICAL, event_set)
                    self._events_registered += 1
                except nvml.NVMLError as err:
                    log.warning(
                        "cannot watch GPU %s for XID events, its health is polled: %s",
                        uuid,
                        self._describe(err),
                        extra={"gpu_uuid": uuid},
                    )
            return self._events_registered > 0

    def _wait_xid(self, timeout_ms: int) -> bool:
        """True when an XID arrived that makes a GPU unhealthy (or an error hides which GPU it hit)."""
        nvml = self._nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        with self._lock:
            if self._closed or self._event_set is None:
                return False
            self._waiting += 1
            event_set = self._event_set
        try:
            data = wait(event_set, timeout_ms)
        except nvml.NVMLError as err:
            if self._code(err) == _TIMEOUT:
                return False
            log.warning("waiting for NVML events failed: %s", self._describe(err))
            return True
        finally:
            with self._lock:
                self._waiting -= 1
                if self._closed and self._waiting == 0:
                    self._shutdown()  # close() came during the wait and left the event set to us
        if self._closed:
            return False
        if not int(data.eventType) & _EVENT_XID_CRITICAL:
            return False
        xid = int(data.eventData)
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
        except nvml.NVMLError as err:
            log.warning("%s on a GPU NVML cannot name: %s", describe_xid(xid), self._describe(err))
            return True
        if uuid not in self._handles:
            return False
        if not xid_is_fatal(xid, self._recovery_action(self._handles[uuid])):
            log.info(
                "%s on GPU %s needs no recovery: the GPU stays healthy",
                describe_xid(xid),
                uuid,
                extra={"gpu_uuid": uuid, "xid": xid},
            )
            return False
        log.warning("%s on GPU %s", describe_xid(xid), uuid, extra={"gpu_uuid": uuid, "xid": xid})
        with self._lock:
            self._xids[uuid] = xid
        return True

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            if self._waiting == 0:
                self._shutdown()

    def _shutdown(self) -> None:
        """Free the event set and release NVML, once; a wait in flight must not see its set freed."""
        if self._shut_down:
            return
        self._shut_down = True
        nvml = self._nvml
        if self._event_set is not None:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError as err:
                log.debug("freeing the NVML event set failed: %s", self._describe(err))
            self._event_set = None
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as err:
            log.debug("NVML shutdown failed: %s", self._describe(err))
