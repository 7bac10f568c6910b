"""Devices that exist only while a claim holds them (dynamic MIG instances), made at prepare and unmade at
unprepare by their device kind (`DeviceKind.maker`, asked through `devicekinds.KINDS`): the preparer calls
this one object and never asks which kind makes what."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Set
from contextlib import contextmanager
from pathlib import Path

from dra_gpu import devicekinds
from dra_gpu.devicekinds import DeviceMaker, MakerHost, SetupFailed
from dra_gpu.inventory import Inventory
from dra_gpu.kube import KubeAPI
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.locking import KeyLocks, NodeLock
from dra_gpu.plugin.sharing.plan import ClaimInfo, NodeContext, Share


class MadeDevices:
    """Every device kind's maker, asked in the table's order; a maker's failure is a PrepareError."""

    def __init__(
        self,
        node: NodeContext,
        inventory: Inventory,
        lock: NodeLock,
        hook: Callable[[str], None],
        api: KubeAPI,
    ) -> None:
        self.inventory = inventory
        host = MakerHost(
            state_dir=node.state_dir,
            commands=node.commands,
            lock=lock,
            locks=lambda name: KeyLocks(lock.path.parent / name, lock.timeout_s),
            hook=hook,
            api=api,
        )
        self.makers: list[DeviceMaker] = [
            maker for kind in devicekinds.KINDS if (maker := kind.maker(host)) is not None
        ]

    def materialize(self, claim: ClaimInfo, shares: list[Share]) -> list[Share]:
        """The shares, those on devices made at prepare with their device made (or adopted)."""
        gpus = self.inventory.gpus()
        with _as_prepare_error():
            for maker in self.makers:
                shares = maker.materialize(claim, shares, gpus)
        return shares

    def lost(self, uid: str) -> list[str]:
        """The claim's made devices that are gone (a reboot, a GPU reset), each described."""
        gpus = self.inventory.gpus()
        with _as_prepare_error():
            return [gone for maker in self.makers for gone in maker.lost(uid, gpus)]

    def release(self, uid: str) -> None:
        """Unmake the claim's made devices; PrepareError while one is in use."""
        gpus = self.inventory.gpus()
        with _as_prepare_error():
            for maker in self.makers:
                maker.release(uid, gpus)

    def reconcile(self, claims: Set[str]) -> None:
        """At start: unmake what interrupted prepares of claims that are gone left made."""
        gpus = self.inventory.gpus()
        for maker in self.makers:
            maker.reconcile(claims, gpus)

    def temp_files(self) -> list[Path]:
        """Temporary files the makers' interrupted writes left."""
        return [path for maker in self.makers for path in maker.temp_files()]


@contextmanager
def _as_prepare_error() -> Iterator[None]:
    """A maker's SetupFailed as the PrepareError that the kubelet's answer and the claim's event carry."""
    try:
        yield
    except SetupFailed as exc:
        raise PrepareError(exc.message, reason=exc.reason) from None
