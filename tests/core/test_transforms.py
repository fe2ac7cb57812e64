import pytest
import torch

from fedge.core import transforms as T
from fedge.core.errors import ConfigError


def _run(tx, grads_seq, params):
    state = tx.init(params)
    for g in grads_seq:
        upd, state = tx.update(g, state, params)
        params = T.apply_updates(params, upd)
    return params


def test_sgd_lr1_on_negative_delta_is_fedavg():
    p = {"w": torch.tensor([1.0, 2.0])}
    delta = torch.tensor([0.5, -1.0])
    out = _run(T.sgd(1.0), [{"w": -delta}], p)
    assert torch.allclose(out["w"], p["w"] + delta)


@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_sgd_matches_torch(momentum, nesterov):
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(5, generator=g)
    grads = [torch.randn(5, generator=g) for _ in range(4)]
    out = _run(
        T.sgd(0.1, momentum=momentum, nesterov=nesterov), [{"w": x} for x in grads], {"w": w0}
    )
    w = w0.clone().requires_grad_()
    opt = torch.optim.SGD([w], lr=0.1, momentum=momentum, nesterov=nesterov)
    for x in grads:
        w.grad = x.clone()
        opt.step()
    assert torch.allclose(out["w"], w.detach(), atol=1e-6)


def test_adam_matches_torch():
    g = torch.Generator().manual_seed(1)
    w0 = torch.randn(6, generator=g)
    grads = [torch.randn(6, generator=g) for _ in range(5)]
    out = _run(T.adam(0.01, b1=0.9, b2=0.99), [{"w": x} for x in grads], {"w": w0})
    w = w0.clone().requires_grad_()
    opt = torch.optim.Adam([w], lr=0.01, betas=(0.9, 0.99))
    for x in grads:
        w.grad = x.clone()
        opt.step()
    assert torch.allclose(out["w"], w.detach(), atol=1e-6)


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_weight_decay_and_lr_decay_match_torch(name):
    """Oracle: torch.optim with weight_decay and an ExponentialLR stepped after each update."""
    g = torch.Generator().manual_seed(2)
    w0 = torch.randn(6, generator=g)
    grads = [torch.randn(6, generator=g) for _ in range(6)]
    if name == "sgd":
        tx = T.sgd(0.1, momentum=0.9, weight_decay=1e-2, lr_decay=0.9)
        make = lambda w: torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=1e-2)  # noqa: E731
    else:
        tx = T.adam(0.01, b1=0.9, b2=0.99, weight_decay=1e-2, lr_decay=0.9)
        make = lambda w: torch.optim.Adam([w], lr=0.01, betas=(0.9, 0.99), weight_decay=1e-2)  # noqa: E731
    out = _run(tx, [{"w": x} for x in grads], {"w": w0})
    w = w0.clone().requires_grad_()
    opt = make(w)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    for x in grads:
        w.grad = x.clone()
        opt.step()
        sched.step()
    assert torch.allclose(out["w"], w.detach(), atol=1e-6)


def test_yogi_and_adagrad_by_hand():
    g = torch.tensor([2.0])
    # Adagrad (b1 = 0): v = 0 + 4, u = -lr * 2 / (2 + eps)
    (u, _) = T.adagrad(0.5, eps=1e-3).update(
        {"w": g}, T.adagrad(0.5, eps=1e-3).init({"w": g}), {"w": g}
    )
    assert torch.allclose(u["w"], torch.tensor([-0.5 * 2 / (2 + 1e-3)]))
    # Yogi first step: m = 0.1*2 = 0.2, v = 1e-6 - 0.01*4*sign(1e-6 - 4) = 0.040001
    tx = T.yogi(1.0, b1=0.9, b2=0.99, eps=1e-3)
    (u, _) = tx.update({"w": g}, tx.init({"w": g}), {"w": g})
    v = 1e-6 + 0.01 * 4
    assert torch.allclose(u["w"], torch.tensor([-0.2 / (v**0.5 + 1e-3)]))


def test_clip_by_global_norm():
    tx = T.clip_by_global_norm(1.0)
    out, _ = tx.update({"a": torch.tensor([3.0]), "b": torch.tensor([4.0])}, (), {})
    assert torch.allclose(torch.cat([out["a"], out["b"]]), torch.tensor([0.6, 0.8]))
    same, _ = T.clip_by_global_norm(10.0).update({"a": torch.tensor([3.0])}, (), {})
    assert torch.equal(same["a"], torch.tensor([3.0]))


def test_ema_plain_and_warmup():
    s = T.ema_init({"w": torch.tensor([0.0])})
    s = T.ema_update(s, {"w": torch.tensor([1.0])}, decay=0.9)
    assert torch.allclose(s["avg"]["w"], torch.tensor([0.1]))
    s = T.ema_init({"w": torch.tensor([0.0])})
    s = T.ema_update(s, {"w": torch.tensor([1.0])}, decay=0.995, warmup=True)  # d = 1/10
    assert torch.allclose(s["avg"]["w"], torch.tensor([0.9]))


@pytest.mark.parametrize(
    "factory",
    [
        lambda: T.sgd(0.0),
        lambda: T.sgd(1.0, momentum=1.0),
        lambda: T.adam(0.1, b2=1.5),
        lambda: T.sgd(0.1, lr_decay=1.5),
        lambda: T.sgd(0.1, weight_decay=-1.0),
    ],
)
def test_bad_hyperparameters_raise(factory):
    with pytest.raises(ConfigError):
        factory()


def test_ema_momentum_by_hand():
    # β = 0.5, g = 2 then 4: m1 = 1, u1 = 1/(1-0.5) = 2; m2 = 0.5 + 2 = 2.5, u2 = 2.5/(1-0.25) = 10/3.
    tx = T.scale_by_ema_momentum(0.5)
    s = tx.init({"w": torch.zeros(1)})
    u, s = tx.update({"w": torch.tensor([2.0])}, s, {})
    assert torch.allclose(u["w"], torch.tensor([2.0]))
    u, s = tx.update({"w": torch.tensor([4.0])}, s, {})
    assert torch.allclose(u["w"], torch.tensor([10.0 / 3.0]))
    assert torch.allclose(s["m"]["w"], torch.tensor([2.5])) and s["t"] == 2
    u, _ = T.scale_by_ema_momentum(0.5, bias_correction=False).update(
        {"w": torch.tensor([2.0])}, {"m": {"w": torch.zeros(1)}, "t": 0}, {}
    )
    assert torch.allclose(u["w"], torch.tensor([1.0]))
    # zo_sgdm descends: w = 1 - lr·u
    out = _run(
        T.zo_sgdm(0.1, beta=0.5),
        [{"w": torch.tensor([2.0])}, {"w": torch.tensor([4.0])}],
        {"w": torch.ones(1)},
    )
    assert torch.allclose(out["w"], torch.tensor([1.0 - 0.2 - 1.0 / 3.0]))


def test_zo_adamm_by_hand():
    # b1 = 0.5, b2 = 0.5, eps = 0; g = 2 then 0.
    # t1: m = 1, v = 2, vhat = 2, u = 1/sqrt(2).
    # t2: m = 0.5, v = 1, vhat = max(2, 1) = 2 (AMSGrad keeps the max), u = 0.5/sqrt(2).
    tx = T.scale_by_zo_adamm(b1=0.5, b2=0.5, eps=1e-30)
    s = tx.init({"w": torch.zeros(1, dtype=torch.float64)})
    u, s = tx.update({"w": torch.tensor([2.0], dtype=torch.float64)}, s, {})
    assert torch.allclose(u["w"], torch.tensor([2**-0.5], dtype=torch.float64))
    u, s = tx.update({"w": torch.tensor([0.0], dtype=torch.float64)}, s, {})
    assert torch.allclose(u["w"], torch.tensor([0.5 * 2**-0.5], dtype=torch.float64))
    assert float(s["v"]["w"]) == 1.0 and float(s["vhat"]["w"]) == 2.0
    # Adam without the max would have used v = 1 at t2: the step differs.
    a = T.scale_by_adam(b1=0.5, b2=0.5, eps=1e-30, bias_correction=False)
    sa = a.init({"w": torch.zeros(1, dtype=torch.float64)})
    _, sa = a.update({"w": torch.tensor([2.0], dtype=torch.float64)}, sa, {})
    ua, _ = a.update({"w": torch.tensor([0.0], dtype=torch.float64)}, sa, {})
    assert not torch.allclose(ua["w"], u["w"])
    out = _run(
        T.zo_adamm(0.1, b1=0.5, b2=0.5, eps=1e-30),
        [{"w": torch.tensor([2.0], dtype=torch.float64)}],
        {"w": torch.ones(1, dtype=torch.float64)},
    )
    assert torch.allclose(out["w"], torch.tensor([1.0 - 0.1 * 2**-0.5], dtype=torch.float64))


@pytest.mark.parametrize(
    "factory",
    [lambda: T.scale_by_ema_momentum(1.0), lambda: T.zo_adamm(0.1, b2=1.0), lambda: T.zo_sgdm(0.0)],
)
def test_bad_zo_hyperparameters_raise(factory):
    with pytest.raises(ConfigError):
        factory()


def test_server_optimizer_config_selects_zo_transforms():
    from fedge.methods.base import ServerOptimizerConfig

    p = {"w": torch.ones(1)}
    for name, ref in (
        ("zo_sgdm", T.zo_sgdm(0.1, beta=0.5)),
        ("zo_adamm", T.zo_adamm(0.1, b1=0.5, b2=0.5)),
    ):
        tx = ServerOptimizerConfig(name=name, lr=0.1, b1=0.5, b2=0.5).build()
        seq = [{"w": torch.tensor([2.0])}, {"w": torch.tensor([-1.0])}]
        assert torch.equal(_run(tx, seq, p)["w"], _run(ref, seq, p)["w"])
    with pytest.raises(ValueError, match="weight_decay"):
        ServerOptimizerConfig(name="zo_adamm", weight_decay=0.1)


def _per_param(state):
    """The per-parameter dicts inside a transform's state (dicts keyed by the parameter names)."""
    if isinstance(state, dict) and set(state) == {"a", "b"}:
        return [state]
    if isinstance(state, dict):
        return [d for v in state.values() for d in _per_param(v)]
    if isinstance(state, tuple | list):
        return [d for v in state for d in _per_param(v)]
    return []


@pytest.mark.parametrize(
    "make",
    [
        lambda: T.trace(0.9),
        lambda: T.trace(0.9, nesterov=True),
        lambda: T.scale_by_adam(),
        lambda: T.scale_by_yogi(),
        lambda: T.scale_by_adagrad(b1=0.5),
        lambda: T.scale_by_ema_momentum(0.9),
        lambda: T.scale_by_zo_adamm(),
    ],
)
def test_a_parameter_without_a_gradient_keeps_its_state_and_gets_no_update(make):
    """Gradients for only some parameters (BAFFLE's method.perturb): the others' state is carried
    unchanged, the state keeps its structure (a message template still fits it), and only the
    parameters with a gradient get an update; those match an update over them alone."""
    params = {"a": torch.ones(2, 3), "b": torch.ones(4)}
    t = make()
    state = t.init(params)
    full = {"a": torch.full((2, 3), 0.5), "b": torch.full((4,), -0.25)}
    _, state = t.update(full, state, params)  # every parameter has some state now
    part = {"a": torch.full((2, 3), 0.1)}
    out, after = t.update(part, state, params)
    assert set(out) == {"a"}
    before_flat, after_flat = T.state_to_arrays(state), T.state_to_arrays(after)
    assert list(before_flat) == list(after_flat)
    assert all(before_flat[k].shape == after_flat[k].shape for k in before_flat)
    pairs = list(zip(_per_param(state), _per_param(after), strict=True))
    assert pairs  # every one of these transforms keeps per-parameter state
    for old, new in pairs:
        assert list(old) == list(new) == ["a", "b"]
        torch.testing.assert_close(new["b"], old["b"])
    alone = make()
    alone_state = alone.init({"a": params["a"]})
    _, alone_state = alone.update({"a": full["a"]}, alone_state, {"a": params["a"]})
    ref, _ = alone.update(part, alone_state, {"a": params["a"]})
    torch.testing.assert_close(out["a"], ref["a"])
