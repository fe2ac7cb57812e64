"""Local training: the client optimizer's per-round learning-rate decay (NTK-BAFFLE's recipe)."""

from __future__ import annotations

import torch

from fedge.core.context import ClientContext, ClientData
from fedge.core.messages import Message
from fedge.core.meter import Meter
from fedge.methods.local import ClientOptimizerConfig, LocalTraining, backprop_gradient_fn


def _model() -> torch.nn.Module:
    model = torch.nn.Linear(3, 1, bias=False)  # its random init is overwritten below
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0, 0.5]]))
    return model


def test_round_t_uses_lr_times_decay_to_the_t_minus_1():
    cfg = ClientOptimizerConfig(name="sgd", lr=0.1, lr_decay=0.5, weight_decay=1e-3)
    p = torch.nn.Parameter(torch.ones(2))
    assert cfg.build([p]).param_groups[0]["lr"] == 0.1
    assert cfg.build([p], rnd=3).param_groups[0]["lr"] == 0.1 * 0.5**2
    assert (
        ClientOptimizerConfig(name="adam", lr=0.01, lr_decay=0.998)
        .build([p], rnd=11)
        .param_groups[0]["lr"]
        == 0.01 * 0.998**10
    )


def test_local_training_applies_the_round_s_learning_rate():
    """Oracle: one plain SGD step by hand, delta = −lr·decay^(t−1)·∂L/∂W, with ∂L/∂W from autograd."""
    cfg = ClientOptimizerConfig(name="sgd", lr=0.2, lr_decay=0.9)
    x, y = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([0])

    def grad_fn(model, batch, ctx, masks):
        loss = model(batch[0]).square().sum()
        return float(loss.detach()), dict(
            zip(["weight"], torch.autograd.grad(loss, [model.weight]), strict=True)
        )

    client = LocalTraining(
        _model, local_epochs=1, batch_size=1, max_steps=1, optimizer=cfg, gradient_fn=grad_fn
    )
    w0 = _model().weight.detach()
    expected_grad = 2 * (x @ w0.T).item() * x
    for rnd in (1, 4):
        ctx = ClientContext(
            cid=0,
            rnd=rnd,
            data=ClientData(x, y, torch.arange(1)),
            generator=torch.Generator().manual_seed(0),
            meter=Meter(),
        )
        reply = client.run(Message({"weight": w0.clone()}), ctx)
        torch.testing.assert_close(reply.arrays["weight"], -0.2 * 0.9 ** (rnd - 1) * expected_grad)


def test_from_config_and_loader_carry_the_config_fields() -> None:
    # Prepare: a FedAvg config with non-default local fields, a gradient function of our own.
    from fedge.methods.fedavg import FedAvgConfig

    cfg = FedAvgConfig(
        local_epochs=3, batch_size=7, max_steps=5, client_optimizer=ClientOptimizerConfig(lr=0.2)
    )

    def grad_fn(model, batch, ctx, masks):
        return None, {}

    # Execute
    client = LocalTraining.from_config(_model, cfg, gradient_fn=grad_fn)
    loader = LocalTraining.loader(_model)
    # Assert: exactly the config's values (and the default gradient is backprop's).
    assert (client.local_epochs, client.batch_size, client.max_steps) == (3, 7, 5)
    assert client.optimizer == cfg.client_optimizer and client.gradient_fn is grad_fn
    assert LocalTraining.from_config(_model, cfg).gradient_fn is backprop_gradient_fn
    assert (loader.local_epochs, loader.batch_size, loader.max_steps) == (1, 1, 1)
    assert loader.optimizer == ClientOptimizerConfig()


def _square_grad_fn(model, batch, ctx, masks):
    loss = model(batch[0]).square().mean()
    return float(loss.detach()), dict(
        zip(["weight"], torch.autograd.grad(loss, [model.weight]), strict=True)
    )


def _rounds(cfg: ClientOptimizerConfig, rounds: int, steps: int) -> torch.Tensor:
    """``rounds`` rounds of one client whose server hands back the client's own model (one client,
    FedAvg with server lr 1); the client's state carried by the engine's encode/decode."""
    from fedge.core.context import decode_state, encode_state

    x = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    y = torch.zeros(2, dtype=torch.long)
    client = LocalTraining(
        _model,
        local_epochs=steps,
        batch_size=2,
        max_steps=None,
        optimizer=cfg,
        gradient_fn=_square_grad_fn,
    )
    w, state = _model().weight.detach().clone(), b""
    for rnd in range(1, rounds + 1):
        ctx = ClientContext(
            cid=0,
            rnd=rnd,
            data=ClientData(x, y, torch.arange(2)),
            generator=torch.Generator().manual_seed(rnd),
            meter=Meter(),
            state=decode_state(state),
        )
        w = w + client.run(Message({"weight": w.clone()}), ctx).arrays["weight"]
        state = encode_state(ctx.state) if ctx.state else b""
    return w


def test_persistent_adam_over_rounds_equals_one_continuous_adam():
    """Oracle: torch's Adam stepping 6 times without a break equals 3 rounds of 2 local steps
    with the state kept on the client (serialized between rounds as the engine does); a fresh
    optimizer each round (the default) does not."""
    cfg = ClientOptimizerConfig(name="adam", lr=0.05, b2=0.99, state="persistent")
    x = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05, betas=(0.9, 0.99))
    for _ in range(6):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    torch.testing.assert_close(_rounds(cfg, rounds=3, steps=2), model.weight.detach())
    fresh = _rounds(cfg.model_copy(update={"state": "fresh"}), rounds=3, steps=2)
    assert not torch.allclose(fresh, model.weight.detach(), atol=1e-4)


def test_persistent_sgd_momentum_carries_its_buffer_across_rounds():
    cfg = ClientOptimizerConfig(name="sgd", lr=0.01, momentum=0.9, state="persistent")
    x = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(4):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    torch.testing.assert_close(_rounds(cfg, rounds=4, steps=1), model.weight.detach())


def test_a_persistent_state_for_another_shape_is_a_clear_error():
    from fedge.methods.local import restore_optimizer_state

    p = torch.nn.Parameter(torch.ones(3))
    opt = ClientOptimizerConfig(name="adam", state="persistent").build([p])
    store = {
        "client_optimizer.weight.exp_avg": torch.zeros(4),
        "client_optimizer.weight.step": torch.tensor(2.0),
    }
    import pytest

    with pytest.raises(ValueError, match=r"weight\.exp_avg has shape \(4,\), the parameter \(3,\)"):
        restore_optimizer_state(opt, store, names=["weight"])


def test_dropout_draws_are_the_clients_own_whatever_ran_before(tiny):
    """A model with dropout (vgg9) trains the same in the engine's process (clients one after
    another) as in worker processes, and the same when another client ran first: its dropout
    stream is seeded from the client's own generator, not left to torch's global RNG."""
    from fedge.core.config import load_config
    from fedge.experiment.build import build_run

    def round_one(workers: int, burn: bool = False) -> float:
        cfg = load_config(
            tiny(
                model={"name": "vgg9"},
                method={"name": "fedavg", "local_epochs": 1, "batch_size": 16},
                **{"clients.num": 3, "clients.per_round": 3, "clients.workers": workers},
            )
        )
        sim = build_run(cfg).simulation()
        try:
            if burn:
                torch.rand(1000)  # someone else used the global RNG in this process
            return sim.run_round(1)["test_loss"]
        finally:
            sim.close()

    assert any(
        isinstance(m, torch.nn.Dropout)
        for m in build_run(load_config(tiny(model={"name": "vgg9"}))).model_fn().modules()
    )
    base = round_one(0)
    assert round_one(0, burn=True) == base
    assert round_one(2) == base


def test_the_context_carries_the_round_s_global_weights_for_every_step():
    """A gradient hook reads the weights the client received (``ctx.global_arrays``), not the
    moving local ones: what a proximal term pulls towards, with no subclass of LocalTraining."""
    seen: list[torch.Tensor] = []

    def grad_fn(model, batch, ctx, masks):
        seen.append(ctx.global_arrays["weight"].clone())
        return None, {"weight": torch.ones_like(model.weight)}

    client = LocalTraining(
        _model,
        local_epochs=1,
        batch_size=1,
        max_steps=3,
        optimizer=ClientOptimizerConfig(lr=0.1),
        gradient_fn=grad_fn,
    )
    w_t = torch.tensor([[0.5, 0.25, -1.0]])
    x, y = torch.ones(3, 3), torch.zeros(3, dtype=torch.int64)
    ctx = ClientContext(
        cid=0,
        rnd=1,
        data=ClientData(x, y, torch.arange(3)),
        generator=torch.Generator().manual_seed(0),
        meter=Meter(),
    )
    assert ctx.global_arrays is None
    reply = client.run(Message({"weight": w_t.clone()}), ctx)
    assert len(seen) == 3 and all(torch.equal(s, w_t) for s in seen)
    torch.testing.assert_close(reply.arrays["weight"], torch.full((1, 3), -0.3))


def test_a_persistent_state_is_restored_onto_the_parameters_device():
    """Read back from bytes (CPU tensors), Adam's moments go to the parameter's device (meta here,
    which cannot mix with the CPU, as a GPU cannot) and its step count stays on the CPU."""
    from fedge.methods.local import restore_optimizer_state

    meta = torch.nn.Parameter(torch.zeros(2, 3, device="meta"))
    store = {
        "client_optimizer.w.step": torch.tensor(3.0),
        "client_optimizer.w.exp_avg": torch.ones(2, 3),
        "client_optimizer.w.exp_avg_sq": torch.ones(2, 3),
    }
    opt = torch.optim.Adam([meta], lr=0.1)
    restore_optimizer_state(opt, store, names=["w"])
    state = opt.state[meta]
    assert state["step"].device.type == "cpu" and float(state["step"]) == 3.0
    assert state["exp_avg"].device.type == "meta" and state["exp_avg_sq"].device.type == "meta"
