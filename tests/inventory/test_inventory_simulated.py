"""The simulated backend: profiles, stable identities, health switches, and its error messages."""

from __future__ import annotations

import re
import threading

import pytest

from dra_gpu.inventory import KNOWN_MODELS, InventoryError, SimulatedInventory, open_inventory, parse_profile

UUID_FORMAT = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# The format Kubernetes accepts for resource.kubernetes.io/pciBusID.
PCI_FORMAT = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")


def test_profile_gives_the_listed_models_in_order() -> None:
    gpus = SimulatedInventory("2xH100-80GB,1xL4-24GB").gpus()
    h100, l4 = KNOWN_MODELS["H100-80GB"], KNOWN_MODELS["L4-24GB"]
    assert [gpu.index for gpu in gpus] == [0, 1, 2]
    assert [gpu.minor for gpu in gpus] == [0, 1, 2]
    assert [gpu.product_name for gpu in gpus] == [h100.product_name] * 2 + [l4.product_name]
    assert [gpu.memory_bytes for gpu in gpus] == [h100.memory_bytes] * 2 + [l4.memory_bytes]
    assert [gpu.mig_capable for gpu in gpus] == [True, True, False]
    assert all(gpu.healthy and gpu.health_reason == "" for gpu in gpus)


@pytest.mark.parametrize(
    ("model", "product", "architecture", "cc", "gib"),
    [
        ("H100-80GB", "NVIDIA H100 80GB HBM3", "Hopper", "9.0", 80),
        ("H200-141GB", "NVIDIA H200", "Hopper", "9.0", 141),
        ("A100-40GB", "NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 40),
        ("A100-80GB", "NVIDIA A100-SXM4-80GB", "Ampere", "8.0", 80),
        ("L4-24GB", "NVIDIA L4", "Ada Lovelace", "8.9", 24),
        ("L40S-48GB", "NVIDIA L40S", "Ada Lovelace", "8.9", 48),
        ("B200-180GB", "NVIDIA B200", "Blackwell", "10.0", 180),
        ("T4-16GB", "Tesla T4", "Turing", "7.5", 16),
    ],
)
def test_required_models_look_like_the_real_boards(
    model: str, product: str, architecture: str, cc: str, gib: int
) -> None:
    (gpu,) = SimulatedInventory(f"1x{model}").gpus()
    assert (gpu.product_name, gpu.architecture, gpu.cuda_compute_capability) == (product, architecture, cc)
    # Boards report a little under their marketing size (reserved memory), never more.
    assert 0.9 * gib * 10**9 < gpu.memory_bytes <= gib * 2**30


def test_every_model_has_a_consistent_architecture_and_compute_capability() -> None:
    from dra_gpu.inventory.arch import architecture_from_compute_capability

    for model in KNOWN_MODELS.values():
        assert architecture_from_compute_capability(model.compute_capability) == model.architecture, model.key


def test_same_profile_and_node_give_the_same_uuids() -> None:
    first = SimulatedInventory("2xH100-80GB,1xL4-24GB", seed="node-a").gpus()
    again = open_inventory("simulated:2xH100-80GB,1xL4-24GB", seed="node-a").gpus()
    assert first == again
    assert all(UUID_FORMAT.match(gpu.uuid) for gpu in first)
    assert len({gpu.uuid for gpu in first}) == 3


def test_two_nodes_have_different_gpus() -> None:
    a = {gpu.uuid for gpu in SimulatedInventory("4xH100-80GB", seed="node-a").gpus()}
    b = {gpu.uuid for gpu in SimulatedInventory("4xH100-80GB", seed="node-b").gpus()}
    assert not a & b


def test_adding_a_gpu_at_the_end_keeps_the_existing_identities() -> None:
    before = SimulatedInventory("2xH100-80GB", seed="n").gpus()
    after = SimulatedInventory("2xH100-80GB,1xL4-24GB", seed="n").gpus()
    assert [gpu.uuid for gpu in after[:2]] == [gpu.uuid for gpu in before]


def test_pci_bus_ids_are_valid_for_kubernetes_and_unique() -> None:
    gpus = SimulatedInventory("20xL4-24GB").gpus()
    assert all(PCI_FORMAT.match(gpu.pci_bus_id) for gpu in gpus)
    assert len({gpu.pci_bus_id for gpu in gpus}) == 20


def test_profile_spelling_is_forgiving_about_case_and_spaces() -> None:
    assert parse_profile(" 2x h100-80gb , 1X L4-24GB ") == parse_profile("2xH100-80GB,1xL4-24GB")


@pytest.mark.parametrize(
    ("profile", "bad_part", "why"),
    [
        ("3xFOO", "'3xFOO'", "unknown GPU model 'FOO'"),
        ("0xH100-80GB", "'0xH100-80GB'", "the count must be at least 1"),
        ("H100", "'H100'", "is not COUNTxMODEL"),
        ("H100-80GB", "'H100-80GB'", "has no count (write 1xH100-80GB"),
        ("2xH100-80GB,,1xL4-24GB", "''", "is not COUNTxMODEL"),
        ("", "''", "is empty"),
        ("129xH100-80GB", "'129xH100-80GB'", "above 128 GPUs"),
    ],
)
def test_bad_profiles_name_the_bad_part_and_list_known_models(profile: str, bad_part: str, why: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_profile(profile)
    message = str(caught.value)
    assert f"{bad_part} " in message and why in message
    assert all(model in message for model in KNOWN_MODELS)


@pytest.mark.parametrize(
    ("spec", "words"),
    [("simulated:", "has no profile"), ("gpu", "unknown inventory 'gpu'"), ("simulated:3xFOO", "'3xFOO'")],
)
def test_bad_inventory_specs(spec: str, words: str) -> None:
    with pytest.raises(InventoryError, match=re.escape(words)):
        open_inventory(spec)


def test_set_health_marks_one_gpu_and_wakes_the_health_loop() -> None:
    inv = SimulatedInventory("2xH100-80GB")
    assert not inv.wait_health_event(0)
    inv.set_health(1, False, "XID 79: GPU has fallen off the bus")
    assert inv.wait_health_event(0)
    first, second = inv.refresh_health()
    assert first.healthy
    assert (second.healthy, second.health_reason) == (False, "XID 79: GPU has fallen off the bus")
    assert not inv.wait_health_event(0), "the change was consumed by refresh_health"
    inv.set_health(1, True)
    assert inv.wait_health_event(0)
    assert all(gpu.healthy and gpu.health_reason == "" for gpu in inv.refresh_health())


def test_setting_the_same_health_again_is_no_event() -> None:
    inv = SimulatedInventory("1xT4-16GB")
    inv.set_health(0, True)
    assert not inv.wait_health_event(0)


def test_unhealthy_without_a_reason_still_explains_itself() -> None:
    inv = SimulatedInventory("1xT4-16GB")
    inv.set_health(0, False)
    assert inv.gpus()[0].health_reason


def test_set_health_on_a_missing_gpu_says_which_exist() -> None:
    with pytest.raises(
        InventoryError, match=r"no simulated GPU with index 2: this node has 2 \(indexes 0 to 1\)"
    ):
        SimulatedInventory("2xA100-40GB").set_health(2, False, "x")


def test_wait_returns_as_soon_as_another_thread_changes_health() -> None:
    inv = SimulatedInventory("2xH100-80GB")
    started = threading.Event()
    results: list[bool] = []

    def loop() -> None:
        started.set()
        results.append(inv.wait_health_event(60))

    waiter = threading.Thread(target=loop)
    waiter.start()
    started.wait(30)
    inv.set_health(0, False, "ECC")
    waiter.join(30)
    assert results == [True]
