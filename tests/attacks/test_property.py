"""Property inference (Melis et al. 2019) through the real engine: clear uploads leak whether a
class is in the batch, the masked vector of secure aggregation does not."""

from __future__ import annotations

import warnings

import torch

from fedge.attacks.harness import attack_config, observe_run
from fedge.attacks.property import aux_batch, edge_pia_attack, pia_attack, plaintext_program


def _pia(method: dict, clients: int = 32) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = observe_run(
            attack_config(method, clients=clients, per_client=8, dataset="digits", test=360)
        )
    return pia_attack(run, prop=0, aux_updates=64)


def test_aux_batches_have_or_lack_the_property_by_construction() -> None:
    y = torch.arange(100) % 10
    for i in range(20):
        g = torch.Generator().manual_seed(i)
        with_ = aux_batch(y, 8, 3, True, g)
        without = aux_batch(y, 8, 3, False, g)
        assert len(with_) == len(without) == 8
        assert bool((y[with_] == 3).any()) and not bool((y[without] == 3).any())


def test_fedsgd_batch_gradients_reveal_the_class_and_masked_ones_do_not() -> None:
    clear = _pia({"name": "fedsgd", "batch_size": 8})
    assert not clear["masked"] and 0 < clear["with_property"] < clear["uploads"] == 32
    assert clear["auc"] > 0.8
    masked = _pia({"name": "fedsgd", "batch_size": 8, "secure_aggregation": True})
    assert (
        masked["masked"] and masked["train_accuracy"] > 0.9
    )  # the classifier works on plaintexts ...
    assert abs(masked["auc"] - 0.5) < 0.25  # ... and finds nothing in the masked vectors


def test_baffle_k_values_reveal_the_class_without_secure_aggregation() -> None:
    r = _pia(
        {"name": "baffle", "mode": "batch", "k": 100, "ema": None, "secure_aggregation": False},
        clients=16,
    )
    assert r["classifiers"] == 1 and r["auc"] > 0.8


def test_the_server_simulates_the_plaintext_program_beneath_secure_aggregation() -> None:
    from fedge.methods.secure import SecureClient

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = observe_run(
            attack_config(
                {"name": "fedsgd", "batch_size": 1, "secure_aggregation": True},
                clients=2,
                per_client=1,
                dataset="digits",
            )
        )
    assert isinstance(run.built.method.program, SecureClient)
    assert not isinstance(plaintext_program(run.built.method.program), SecureClient)


def test_property_inference_is_reproducible_from_its_seed() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = observe_run(
            attack_config(
                {"name": "fedsgd", "batch_size": 8, "secure_aggregation": True},
                clients=16,
                per_client=8,
                dataset="digits",
                test=360,
            )
        )
    a, b = pia_attack(run, seed=3, aux_updates=32), pia_attack(run, seed=3, aux_updates=32)
    assert a == b


def test_edge_server_infers_the_property_from_released_activations_and_labels() -> None:
    """Property inference at EPPFL's edge server (no DP) separates devices with class 0 in
    their batch: exactly from the labels that travel in the clear, and from the released
    activations alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = observe_run(
            attack_config(
                {"name": "eppfl", "local_epochs": 1, "batch_size": 8},
                clients=24,
                per_client=8,
                test=300,
                dataset="digits",
            ),
            parties=("edge",),
        )
    r = edge_pia_attack(run, prop=0)
    assert r["uploads"] == 24 and 0 < r["with_property"] < 24
    # the step messages carry the batch's labels in the clear: the property is read off them
    assert r["labels_in_clear"] and r["auc"] == 1.0
    assert r["auc_activations"] > 0.8  # the released activations alone also give it away here
