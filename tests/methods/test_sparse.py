"""method.train_mask: a data-free mask keeps exactly its density of the trainable conv/linear
weights; zeroth-order clients perturb only kept coordinates; with BAFFLE (both modes) and FedAvg
no weight off the mask ever changes, while kept ones train."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.core.rng import generator, make_generator
from fedge.estimators import loss_differences
from fedge.experiment.build import build_run
from fedge.methods.sparse import choose_train_masks, combine_masks, masks_digest
from fedge.models import build_model
from fedge.pruning import prunable_parameters


@pytest.mark.parametrize("rule", ["magnitude", "random", "ntk"])
@pytest.mark.parametrize("density", [0.013, 0.3, 1.0])
def test_the_mask_keeps_exactly_its_density_of_the_trainable_weights(rule, density):
    model = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, channels=(4, 8), seed=0)
    for p in model.features.conv1.parameters():  # frozen weights are never in the mask
        p.requires_grad_(False)
    masks = choose_train_masks(
        model,
        rule=rule,
        density=density,
        generator=generator(0, "train-mask"),
        input_shape=(1, 28, 28),
        num_inputs=8,
    )
    params = dict(model.named_parameters())
    trainable = [n for n in prunable_parameters(model) if params[n].requires_grad]
    assert sorted(masks) == sorted(trainable) and "features.conv1.conv.weight" not in masks
    n = sum(params[k].numel() for k in trainable)
    assert sum(int(m.sum()) for m in masks.values()) == round(density * n)
    assert all(m.dtype == torch.bool and m.shape == params[k].shape for k, m in masks.items())


def test_magnitude_keeps_the_largest_weights_and_rules_differ():
    model = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, channels=(4, 8), seed=0)
    kw = dict(density=0.2, input_shape=(1, 28, 28), num_inputs=8)
    mag = choose_train_masks(model, rule="magnitude", generator=generator(0, "m"), **kw)
    params = dict(model.named_parameters())
    kept = torch.cat([params[k].detach().abs()[m] for k, m in mag.items()])
    dropped = torch.cat([params[k].detach().abs()[~m] for k, m in mag.items()])
    assert float(kept.min()) >= float(dropped.max())  # the oracle: a global threshold on |W0|
    rnd = choose_train_masks(model, rule="random", generator=generator(0, "m"), **kw)
    assert any(not torch.equal(mag[k], rnd[k]) for k in mag)
    again = choose_train_masks(model, rule="random", generator=generator(0, "m"), **kw)
    assert all(torch.equal(rnd[k], again[k]) for k in rnd)  # seeded: the same mask again


def test_the_perturbation_is_zero_off_the_mask():
    """Oracle: ΔL_k = L(W + σ z_k ⊙ m) − L(W) written out with the seeded z_k (forward scheme):
    the estimator's differences under the train mask perturb kept coordinates only."""
    from fedge.estimators.perturbation import standard_normal

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)
    mask = {"1.weight": torch.rand(3, 4, generator=g) < 0.4}
    sigma, seed = 1e-2, 3
    got = loss_differences(
        model, F.cross_entropy, (x, y), masks=mask, k=4, sigma=sigma, scheme="forward", seed=seed
    )
    w, b = model[1].weight.detach(), model[1].bias.detach()

    def loss(wt, bt):
        return F.cross_entropy(F.linear(x, wt, bt).double(), y).item()

    want = []
    for k in range(4):
        dw = standard_normal(seed, k, "1.weight", w.shape) * sigma * mask["1.weight"]
        db = standard_normal(seed, k, "1.bias", b.shape) * sigma  # no mask: perturbed whole
        want.append(loss(w + dw, b + db) - loss(w, b))
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), rtol=1e-4, atol=1e-7)
    assert combine_masks(None, mask) == mask and combine_masks(None, None) is None
    both = combine_masks({"1.weight": ~mask["1.weight"]}, mask)
    assert both is not None and not bool(both["1.weight"].any())


def _section(method: str, mode: str | None = None, **extra):
    base = {"name": method, "train_mask": {"rule": "magnitude", "density": 0.25}, **extra}
    if method == "baffle":
        base.update(mode=mode, k=6, batch_size=16, ema=None, secure_aggregation=False, max_steps=2)
    return base


@pytest.mark.parametrize(
    ("method", "mode", "extra"),
    [
        ("baffle", "batch", {}),
        (
            "baffle",
            "epoch",
            {"client_optimizer": {"name": "adam", "lr": 0.05, "weight_decay": 0.1}},
        ),
        ("fedavg", None, {"client_optimizer": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.1}}),
    ],
)
def test_weights_off_the_mask_never_change_and_kept_ones_train(tiny, method, mode, extra):
    """Two rounds: every coordinate off the mask holds its initial value bit for bit (also under
    weight decay, which moves zero-gradient weights), kept coordinates move."""
    cfg = load_config(
        tiny(
            rounds=2, model={"name": "mlp", "hidden": [16]}, method=_section(method, mode, **extra)
        )
    )
    with pytest.warns() if method == "baffle" and mode == "batch" else _nothing():
        built = build_run(cfg)
    assert "train_mask" in built.method.applied
    model = built.method.strategy.model
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    masks = choose_train_masks(
        built.model_fn(),
        rule="magnitude",
        density=0.25,
        generator=generator(0, "train-mask"),
        input_shape=(1, 8, 8),
    )
    sim = built.simulation()
    try:
        for r in (1, 2):
            sim.run_round(r)
    finally:
        sim.close()
    after = dict(sim.strategy.model.named_parameters())
    for k, m in masks.items():
        assert torch.equal(after[k].detach()[~m], before[k][~m]), k
    assert any(not torch.equal(after[k].detach()[m], before[k][m]) for k, m in masks.items())


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_method_that_cannot_honour_the_mask_refuses_the_key(tiny):
    cfg = tiny(method={"name": "fedkseed", "train_mask": {"rule": "random", "density": 0.5}})
    with pytest.raises(ConfigError, match=r"method.train_mask: method 'fedkseed' cannot take"):
        build_run(load_config(cfg))


def test_the_build_reports_its_masks_digest_for_the_parties_to_compare(tiny):
    """``MethodBuild.rebuilt["train_mask"]`` is the sha256 of the mask every party chooses
    itself (the Flower handshake compares it); one coordinate, a name or a shape changes it."""
    cfg = load_config(
        tiny(rounds=1, model={"name": "mlp", "hidden": [16]}, method=_section("fedavg"))
    )
    built = build_run(cfg)
    masks = choose_train_masks(
        built.model_fn(),
        rule="magnitude",
        density=0.25,
        generator=make_generator(cfg.draws, cfg.seed, "train-mask"),
        input_shape=(1, 8, 8),
    )
    assert built.method.rebuilt == {"train_mask": masks_digest(masks)}
    assert masks_digest(dict(reversed(list(masks.items())))) == masks_digest(masks)
    name = next(iter(masks))
    flipped = {**masks, name: masks[name].clone()}
    flipped[name].view(-1)[0] ^= True
    renamed = {("x" + k if k == name else k): m for k, m in masks.items()}
    reshaped = {**masks, name: masks[name].reshape(-1)}
    digests = {masks_digest(m) for m in (masks, flipped, renamed, reshaped)}
    assert len(digests) == 4
    plain = build_run(load_config(tiny(rounds=1, model={"name": "mlp", "hidden": [16]})))
    assert plain.method.rebuilt == {}
