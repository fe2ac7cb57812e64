"""The attacks read the uploads of the seed-and-scalar methods (FedKSeed, DeComFL, FeedSign)
through the real engine: the update a server rebuilds from a client's scalars and the public
seeds is the client's own model change, DLG runs on it, and secure aggregation is refused."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from fedge.attacks.harness import ObservedRun, attack_config, observe_run
from fedge.attacks.reconstruct_run import rebuilt_direction_sum, reconstruction_attack
from fedge.core.errors import ConfigError
from fedge.methods import fedkseed, get_method
from fedge.methods.base import model_arrays


def _observe(method: dict[str, Any], clients: int = 2) -> ObservedRun:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return observe_run(attack_config(method, clients=clients, per_client=2, dataset="digits"))


def _rebuilt_change(run: ObservedRun) -> dict[int, dict[str, torch.Tensor]]:
    """cid -> −η D, D rebuilt from the client's round-1 scalars and the public seeds."""
    built, out = run.built, {}
    for v in run.views:
        model = built.model_fn()
        d = rebuilt_direction_sum(
            built.config.method.name, v, model, built.method_config, built.config.draws
        )
        read = get_method(built.config.method.name).seed_scalars
        assert read is not None
        lr = read(built.method_config, v.config, v.upload, built.config.draws).lr
        out[v.cid] = {n: -lr * t for n, t in d.items()}
    return out


def _assert_change(
    rebuilt: dict[str, torch.Tensor], final: torch.nn.Module, initial: dict[str, torch.Tensor]
) -> None:
    for n, p in final.named_parameters():
        change = p.detach() - initial[n]
        assert change.abs().max() > 0  # the client did move
        torch.testing.assert_close(rebuilt[n], change, rtol=1e-4, atol=1e-7)


def test_fedkseed_rebuilt_update_is_the_clients_model_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    finals: list[torch.nn.Module] = []  # each client's local model (stepped in place)

    def spy(model: torch.nn.Module, *args: Any, **kwargs: Any) -> float:
        if not finals or finals[-1] is not model:
            finals.append(model)
        return fedkseed_projected(model, *args, **kwargs)

    fedkseed_projected = fedkseed.projected_gradient
    monkeypatch.setattr(fedkseed, "projected_gradient", spy)
    run = _observe(
        {
            "name": "fedkseed",
            "k": 8,
            "local_steps": 4,
            "batch_size": 1,
            "lr": 0.05,
            "secure_aggregation": False,
        }
    )
    initial = model_arrays(run.built.model_fn())
    rebuilt = _rebuilt_change(run)
    assert sorted(rebuilt) == [0, 1] and len(finals) == 2
    for cid, final in enumerate(finals):  # clients run in id order, in this process
        _assert_change(rebuilt[cid], final, initial)


def _server_model(run: ObservedRun) -> torch.nn.Module:
    strategy: Any = run.observer.inner
    while not hasattr(strategy, "global_model"):  # through the composer's wrappers
        strategy = strategy.inner
    return strategy.global_model.model


def test_decomfl_rebuilt_update_is_the_update_its_scalars_make() -> None:
    """A DeComFL client's last local step is never taken locally (its model is not used), so
    the update its K × P scalars make is the server's with this client alone: x_2 − x_1,
    computed by the method's own replay of K SGD steps (RoundSteps)."""
    run = _observe(
        {
            "name": "decomfl",
            "p": 3,
            "local_steps": 3,
            "batch_size": 1,
            "estimator": "lean",
            "optimizer": {"name": "sgd", "lr": 0.05},
            "secure_aggregation": False,
            "ema": None,
        },
        clients=1,
    )
    initial = model_arrays(run.built.model_fn())
    rebuilt = _rebuilt_change(run)
    assert sorted(rebuilt) == [0]
    _assert_change(rebuilt[0], _server_model(run), initial)


@pytest.mark.parametrize(
    "method",
    [
        {"name": "fedkseed", "k": 16, "local_steps": 2, "batch_size": 1},
        {"name": "decomfl", "p": 4, "local_steps": 2, "batch_size": 1},
        {"name": "feedsign", "batch_size": 1},
    ],
)
def test_dlg_runs_on_the_rebuilt_update(method: dict[str, Any]) -> None:
    run = _observe({**method, "secure_aggregation": False})
    s = reconstruction_attack(run, iterations=20)
    dlg = s["attacks"]["dlg-seed-sum"]
    assert s["clients_attacked"] == 2 and not s["masked"]
    assert torch.isfinite(torch.tensor(dlg["median_mse"])) and dlg["finite_objective"] == 1.0


@pytest.mark.parametrize("name", ["fedkseed", "decomfl"])
def test_secure_aggregation_is_refused_naming_the_fix(name: str) -> None:
    with pytest.raises(ConfigError, match="sees only the sum.*method.secure_aggregation=false"):
        _observe({"name": name, "batch_size": 1})  # on by default
