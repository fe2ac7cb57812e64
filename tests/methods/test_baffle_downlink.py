"""Seeds and scalars down (``downlink: seeds``): clients rebuild the server's model bit for bit
from the round seeds and aggregated loss differences they missed (oracle: the server's own
model, and a ``downlink: model`` run that must train identically)."""

import pytest
import torch

from fedge.core import transforms as T
from fedge.core.config import load_config
from fedge.core.errors import MessageError
from fedge.experiment.build import build_run
from fedge.methods.base import GlobalModel, model_arrays
from fedge.methods.replay import DownlinkHistory
from fedge.runtime.engine import decode_state

K = 8


def _sim(tiny, downlink, *, workers=0, per_round=2, secure=False, perturb=None):
    method = {
        "name": "baffle",
        "mode": "batch",
        "k": K,
        "batch_size": 16,
        "ema": None,
        "downlink": downlink,
        "secure_aggregation": secure,
        **({"perturb": perturb} if perturb else {}),
    }
    cfg = load_config(
        tiny(
            model={"name": "mlp", "hidden": [16]},
            method=method,
            **{"clients.num": 5, "clients.per_round": per_round, "clients.workers": workers},
        )
    )
    return build_run(cfg).simulation()


@pytest.mark.parametrize(
    "workers, secure, perturb",
    [(0, False, None), (2, False, None), (2, True, None), (0, False, ["features.*"])],
)
def test_clients_rebuild_the_servers_model_exactly(tiny, workers, secure, perturb):
    """Also with ``method.perturb`` (some parameters only): the server's Adam keeps the others'
    (zero) moments, so the state a client rebuilds keeps its shape round after round."""
    seeds = _sim(tiny, "seeds", workers=workers, secure=secure, perturb=perturb)
    model = _sim(tiny, "model", secure=secure, perturb=perturb)
    snapshots = {1: model_arrays(seeds.strategy.model)}  # W_1: the initial model
    for rnd in range(1, 7):
        a, b = seeds.run_round(rnd), model.run_round(rnd)
        assert a["test_loss"] == b["test_loss"]  # a wrong rebuild would change a client's ΔL
        snapshots[rnd + 1] = model_arrays(seeds.strategy.model)
    seeds.close()
    held = {c: decode_state(s) for c, s in seeds.client_states.items()}
    assert len(held) >= 4  # several clients, most of which skipped rounds
    for c, st in held.items():
        w = {k[2:]: v for k, v in st.items() if k.startswith("w/")}
        want = snapshots[st["at"]]
        assert all(torch.equal(w[k], want[k]) for k in want), (
            f"client {c} holds a model unlike W_{st['at']}"
        )


def test_downlink_of_a_client_from_the_previous_round_is_seed_and_k_scalars(tiny):
    sim = _sim(tiny, "seeds", per_round=5)  # every client every round
    first = sim.run_round(1)
    second = sim.run_round(2)
    assert first["bytes_down"] / 5 > 3 * 4 * 16 * 64  # round 1: the model and Adam's two moments
    assert second["bytes_down"] / 5 < 8 * K + 64


def test_history_falls_back_to_the_full_state_when_replay_costs_more():
    layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        layer.bias.zero_()
    server = GlobalModel(layer, T.sgd(0.1))
    hist = DownlinkHistory(k=50)
    hist.messages(1, [0, 1], seed=11, server=server)
    assert hist.synced == {}  # sent, not yet confirmed by a reply
    hist.confirm(1, [0, 1])
    g = torch.Generator().manual_seed(0)
    for rnd in range(1, 4):
        hist.record(rnd, seed=100 + rnd, combined=torch.randn(50, generator=g))
    msgs = hist.messages(4, [0], seed=12, server=server)
    assert (
        "replay_dL" not in msgs[0].arrays and "weight" in msgs[0].arrays
    )  # 3·(200+8) B > a 6-weight model
    hist.confirm(4, [0])
    assert msgs[0].config["sync_to"] == 4 and hist.synced == {0: 4, 1: 1}


def test_a_client_out_of_step_is_told_so(tiny):
    sim = _sim(tiny, "seeds", per_round=5)
    sim.run_round(1)
    sim.strategy.downlink.synced[0] = (
        2  # the server believes client 0 holds a newer model than it does
    )
    with pytest.raises(MessageError, match="out of step"):
        sim.run_round(2)


def test_seeds_downlink_needs_batch_mode_and_shared_perturbations(tiny):
    from fedge.methods.baffle import BaffleConfig

    with pytest.raises(ValueError, match="mode=batch"):
        BaffleConfig(mode="epoch", downlink="seeds")
    with pytest.raises(ValueError, match="shared_perturbations"):
        BaffleConfig(mode="batch", downlink="seeds", shared_perturbations=False)
