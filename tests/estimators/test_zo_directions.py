"""Perturbation directions (gaussian, orthogonal, block) and subsets, against exact oracles."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedge.core.errors import ConfigError
from fedge.estimators import estimate_gradient, loss_differences, zeroth_order_gradient
from fedge.estimators.directions import (
    Directions,
    block_split,
    hadamard_chunk,
    make_directions,
    match_params,
    portable_hadamard_chunk,
    remembered,
)

DRAWS = pytest.mark.parametrize("draws", ["torch", "portable"])


def _mean_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return out.mean()


class _TwoLinear(nn.Module):
    """L = mean(a(x)) + mean(b(x)): linear in every parameter, two modules (two blocks)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.a = nn.Linear(n, 1)
        self.b = nn.Linear(n, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


def _linear_problem(
    n: int = 5,
) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    model = _TwoLinear(n).double()
    x = torch.randn(16, n, generator=g, dtype=torch.float64) + 0.5
    batch = (x, torch.zeros(16))
    grad = dict(
        zip(
            dict(model.named_parameters()),
            torch.autograd.grad(_mean_loss(model(x), None), list(model.parameters())),
        )
    )
    return model, batch, grad


def _flat(d: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in d.values()])


@pytest.mark.parametrize("chunk", [hadamard_chunk, portable_hadamard_chunk])
def test_orthogonal_directions_are_exactly_orthogonal_for_a_power_of_two(chunk) -> None:
    z = chunk(3, range(64), "w", (8, 8)).view(64, -1).double()
    assert torch.equal(z @ z.t(), 64 * torch.eye(64, dtype=torch.float64))
    assert set(z.unique().tolist()) == {-1.0, 1.0}
    # The next chunk (k = 64..127) is a fresh orthogonal set, not a repeat of the first.
    z2 = chunk(3, range(64, 128), "w", (8, 8)).view(64, -1).double()
    assert torch.equal(z2 @ z2.t(), 64 * torch.eye(64, dtype=torch.float64))
    assert not torch.equal(z2, z)
    # Regenerable one direction at a time, in any order (what the lean client does).
    assert torch.equal(chunk(3, [17], "w", (8, 8))[0], z[17].view(8, 8).float())
    assert torch.equal(chunk(3, [70, 5], "w", (8, 8))[1], z[5].view(8, 8).float())


@pytest.mark.parametrize("kind", ["gaussian", "orthogonal", "block"])
def test_portable_directions_differ_from_torch_and_are_addressed_by_k(kind: str) -> None:
    shapes = {"a.weight": (3, 5), "a.bias": (3,), "b.weight": (4, 5)}
    dirs = make_directions(kind, shapes, 6, draws="portable")
    torch_dirs = make_directions(kind, shapes, 6)
    assert (dirs.draws, torch_dirs.draws) == ("portable", "torch")
    for name, shape in shapes.items():
        z = dirs.draw(4, range(6), name, shape)
        assert not torch.equal(z, torch_dirs.draw(4, range(6), name, shape))
        for k in (5, 0, 3):  # one at a time, any order: the lean client's draws
            assert torch.equal(dirs.draw(4, [k], name, shape)[0], z[k])
    with pytest.raises(ConfigError, match="draws must be one of"):
        make_directions(kind, shapes, 6, draws="numpy")  # type: ignore[arg-type]


@pytest.mark.parametrize("scheme", ["central", "forward"])
def test_orthogonal_with_k_equal_n_recovers_a_linear_gradient_exactly(scheme: str) -> None:
    # One parameter of n = 16 coordinates; K = 16 orthogonal directions span the space:
    # ĝ = (1/K) Σ z zᵀ a = (16/16) a exactly (Gaussian directions do not).
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(16, 1, bias=False).double()
    x = torch.randn(8, 16, generator=g, dtype=torch.float64)
    a = x.mean(0)
    out = {}
    for kind in ("orthogonal", "gaussian"):
        diffs = loss_differences(
            model,
            _mean_loss,
            (x, torch.zeros(8)),
            k=16,
            sigma=0.1,
            seed=2,
            scheme=scheme,
            directions=kind,
        )
        got = estimate_gradient(
            dict(model.named_parameters()), diffs, sigma=0.1, seed=2, scheme=scheme, directions=kind
        )
        out[kind] = got["weight"].view(-1)
    assert torch.allclose(out["orthogonal"], a, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(out["gaussian"], a, rtol=0.1)


@DRAWS
@pytest.mark.parametrize("kind", ["gaussian", "orthogonal", "block"])
def test_estimate_on_a_linear_loss_is_the_directions_sum_exactly(kind: str, draws: str) -> None:
    # ΔL_k = c σ z_kᵀ a exactly, so ĝ = Σ_k w_k z_k z_kᵀ a with the directions' own weights.
    model, batch, a = _linear_problem()
    k = 7
    g = zeroth_order_gradient(
        model,
        _mean_loss,
        batch,
        k=k,
        sigma=0.05,
        seed=11,
        scheme="central",
        directions=kind,
        draws=draws,
    )
    shapes = {n: p.shape for n, p in model.named_parameters()}
    dirs = make_directions(kind, shapes, k, draws=draws)
    z = torch.cat(
        [dirs.draw(11, range(k), n, p.shape).view(k, -1) for n, p in model.named_parameters()], 1
    ).double()
    want = (dirs.weights[:, None] * z * (z @ _flat(a))[:, None]).sum(0)
    assert torch.allclose(_flat(g), want, rtol=1e-5, atol=1e-8)


@DRAWS
@pytest.mark.parametrize("kind", ["gaussian", "orthogonal", "block"])
def test_unbiased_with_constant_one(kind: str, draws: str) -> None:
    # E[Σ_k w_k z_k z_kᵀ] = I across parameters of different modules: the Monte Carlo mean over
    # seeds is I within 4 standard errors (a wrong weight, e.g. 1/K instead of 1/K_b for block,
    # or correlated blocks, e.g. the orthogonal directions without their per-k signs, is off by >= 0.3).
    model, _, _ = _linear_problem(n=3)  # 3 + 1 + 3 = 7 coordinates, blocks a (4) and b (3)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    k, seeds = 4, 3000
    dirs = make_directions(kind, shapes, k, draws=draws)
    acc = torch.zeros(7, 7, dtype=torch.float64)
    sq = torch.zeros(7, 7, dtype=torch.float64)
    for s in range(seeds):
        z = torch.cat(
            [dirs.draw(s, range(k), n, sh).view(k, -1) for n, sh in shapes.items()], 1
        ).double()
        m = (dirs.weights[:, None, None] * z[:, :, None] * z[:, None, :]).sum(0)
        acc += m
        sq += m * m
    mean = acc / seeds
    se = ((sq / seeds - mean**2).clamp_min(1e-12) / seeds).sqrt()
    assert bool(((mean - torch.eye(7, dtype=torch.float64)).abs() <= 4 * se + 1e-9).all()), mean


def test_block_directions_touch_one_block_and_split_k_by_sqrt_size() -> None:
    shapes = {"a.weight": (1, 3), "a.bias": (1,), "b.weight": (10, 10)}
    dirs = make_directions("block", shapes, 12)
    # blocks a (4 coordinates) and b (100): 10 extra split ∝ (2, 10) -> 1 + 1.67, 1 + 8.33 -> 3, 9
    assert block_split([4, 100], 12) == [3, 9]
    assert dirs.weights.tolist() == [1 / 3] * 3 + [1 / 9] * 9
    for k in range(12):
        za = torch.cat(
            [dirs.draw(0, [k], n, s).flatten() for n, s in shapes.items() if n.startswith("a.")]
        )
        zb = dirs.draw(0, [k], "b.weight", (10, 10)).flatten()
        assert (
            (bool(za.ne(0).all()) and bool(zb.eq(0).all()))
            if k < 3
            else (bool(za.eq(0).all()) and bool(zb.ne(0).all()))
        )
    assert sum(block_split([1, 4, 9, 10_000], 37)) == 37
    with pytest.raises(ConfigError, match="k >= the number of blocks"):
        block_split([4, 5, 6], 2)


def test_block_directions_under_masks_split_k_by_kept_coordinates() -> None:
    """A pruned model's blocks are what the masks keep: b.weight keeps 4 of 100 coordinates, so
    blocks a (4) and b (4) share K = 12 evenly; a block pruned away entirely gets no direction.
    The client's forwards, its one-device estimate and the server's rebuild all split alike."""
    shapes = {"a.weight": (1, 3), "a.bias": (1,), "b.weight": (10, 10)}
    keep = torch.zeros(10, 10, dtype=torch.bool)
    keep[0, :4] = True
    assert block_split([4, 4], 12) == [6, 6] and block_split([4, 0, 100], 12) == [3, 0, 9]
    dirs = make_directions("block", shapes, 12, {"b.weight": keep})
    assert dirs.weights.tolist() == [1 / 6] * 12
    gone = make_directions("block", shapes, 2, {"b.weight": torch.zeros(10, 10, dtype=torch.bool)})
    assert gone.weights.tolist() == [0.5, 0.5]  # both directions on block a; b's K_b = 0 needs no k
    assert bool(gone.draw(0, range(2), "b.weight", (10, 10)).eq(0).all())
    with pytest.raises(ConfigError, match="every selected one is masked out"):
        block_split([0, 0], 3)

    model = _TwoLinear(10).double()
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(8, 10, generator=g, dtype=torch.float64), torch.zeros(8))
    masks = {"b.weight": keep[:1].reshape(1, 10)}  # b.weight is (1, 10) here: 4 of 10 kept
    shapes = {n: p.shape for n, p in model.named_parameters()}
    # blocks a (11 coordinates) and b (4 kept): 8 extra ∝ (sqrt 11, 2) -> 1 + 4.99, 1 + 3.01 -> 6, 4
    # (unmasked, b's 10 coordinates would take 5 of them)
    split = make_directions("block", shapes, 10, masks)
    assert split.weights.tolist() == [1 / 6] * 6 + [1 / 4] * 4
    assert make_directions("block", shapes, 10).weights.tolist() == [1 / 5] * 10
    kw = dict(sigma=0.05, seed=3, scheme="central", directions="block", masks=masks)
    one_device = zeroth_order_gradient(model, _mean_loss, batch, k=10, **kw)
    diffs = loss_differences(model, _mean_loss, batch, k=10, **kw)
    rebuilt = estimate_gradient(dict(model.named_parameters()), diffs, **kw)
    # the linear oracle: ĝ = Σ_k w_k z_k z_kᵀ a over the kept coordinates, with the masked split's weights
    a = dict(
        zip(
            shapes, torch.autograd.grad(_mean_loss(model(batch[0]), None), list(model.parameters()))
        )
    )
    keep_of = {
        n: masks.get(n, torch.ones(sh, dtype=torch.bool)).reshape(-1) for n, sh in shapes.items()
    }
    z = torch.cat(
        [split.draw(3, range(10), n, sh).view(10, -1) * keep_of[n] for n, sh in shapes.items()], 1
    ).double()
    want = (split.weights[:, None] * z * (z @ _flat(a))[:, None]).sum(0)
    assert torch.allclose(_flat(one_device), want, rtol=1e-5, atol=1e-8)
    assert torch.allclose(_flat(rebuilt).double(), want, rtol=1e-4, atol=1e-6)


@DRAWS
@pytest.mark.parametrize("kind", ["gaussian", "orthogonal", "block"])
def test_lean_fast_and_threads_agree_for_every_direction_kind(kind: str, draws: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4)
    ).eval()
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(4, 1, 6, 6, generator=g), torch.randint(0, 4, (4,), generator=g))
    big = (torch.randn(12, 1, 6, 6, generator=g), torch.randint(0, 4, (12,), generator=g))
    kw = dict(k=9, sigma=1e-2, seed=5, scheme="central", directions=kind, draws=draws)
    lean = loss_differences(model, F.cross_entropy, batch, mode="lean", **kw)
    fast = loss_differences(model, F.cross_entropy, batch, mode="fast", **kw)  # batched pass
    assert torch.allclose(lean, fast, rtol=1e-4, atol=1e-6)
    lean_big = loss_differences(model, F.cross_entropy, big, mode="lean", **kw)
    threaded = loss_differences(
        model, F.cross_entropy, big, mode="fast", workers=2, **kw
    )  # two spans
    assert torch.allclose(lean_big, threaded, rtol=1e-5, atol=1e-7)
    other = "orthogonal" if kind == "gaussian" else "gaussian"
    gauss = loss_differences(
        model, F.cross_entropy, batch, mode="lean", **{**kw, "directions": other}
    )
    assert not torch.allclose(lean, gauss)


def test_subset_perturbs_and_estimates_only_the_chosen_parameters() -> None:
    model, batch, a = _linear_problem()
    names = match_params([n for n, _ in model.named_parameters()], ["a.*"])
    assert names == ["a.weight", "a.bias"]
    g = zeroth_order_gradient(
        model,
        _mean_loss,
        batch,
        k=5,
        sigma=0.05,
        seed=1,
        scheme="forward",
        params=names,
        directions="orthogonal",
    )
    assert list(g) == names
    # Only a's coordinates move: the loss differences equal those of a model whose b is zero.
    with torch.no_grad():
        model.b.weight.zero_()
    g0 = zeroth_order_gradient(
        model,
        _mean_loss,
        batch,
        k=5,
        sigma=0.05,
        seed=1,
        scheme="forward",
        params=names,
        directions="orthogonal",
    )
    assert all(torch.allclose(g[n], g0[n]) for n in names)
    with pytest.raises(ConfigError, match="matches no parameter"):
        match_params(["a.weight"], ["fc.*"])


def test_unknown_direction_kind_is_one_clear_error() -> None:
    model, batch, _ = _linear_problem()
    with pytest.raises(ConfigError, match="directions must be one of"):
        loss_differences(
            model, _mean_loss, batch, k=2, sigma=0.1, seed=0, scheme="central", directions="sobol"
        )


def test_orthogonal_gives_no_free_lunch_when_k_is_much_smaller_than_n() -> None:
    # The documented claim: cosine gain over Gaussian ≈ sqrt(1 + K/n), negligible for K ≪ n.
    model = nn.Linear(256, 1, bias=False).double()
    a = torch.randn(256, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = a[None, :].repeat(2, 1)
    cos = {}
    for kind in ("gaussian", "orthogonal"):
        vals = []
        for s in range(40):
            g = zeroth_order_gradient(
                model,
                _mean_loss,
                (x, torch.zeros(2)),
                k=16,
                sigma=0.1,
                seed=s,
                scheme="central",
                directions=kind,
            )["weight"].view(-1)
            vals.append(float(g @ a / (g.norm() * a.norm())))
        cos[kind] = sum(vals) / len(vals)
    assert abs(cos["orthogonal"] - math.sqrt(16 / 256)) < 0.03
    assert abs(cos["gaussian"] - math.sqrt(16 / 256)) < 0.04


def test_baffle_config_passes_directions_and_subset_to_the_server() -> None:
    import warnings

    from fedge.methods.baffle import BaffleBatchStrategy, BaffleConfig

    model, _, _ = _linear_problem()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = BaffleConfig(
            mode="batch",
            k=4,
            directions="block",
            perturb=["b.*"],
            clip=None,
        )
    strategy = BaffleBatchStrategy(model, cfg, seed=0)
    diffs = torch.tensor([0.1, -0.2, 0.3, 0.05])
    g = strategy.shared_estimate(1, diffs)
    assert list(g) == ["b.weight"]
    want = estimate_gradient(
        {"b.weight": model.b.weight},
        diffs,
        sigma=cfg.sigma,
        seed=strategy.round_seed(1),
        scheme=cfg.scheme,
        directions="block",
    )
    assert torch.equal(g["b.weight"], want["b.weight"])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    strategy.apply(g)
    after = dict(model.named_parameters())
    assert torch.equal(after["a.weight"], before["a.weight"]) and torch.equal(
        after["a.bias"], before["a.bias"]
    )
    assert not torch.equal(after["b.weight"], before["b.weight"])


def test_remembered_draws_each_direction_once_and_returns_the_same_numbers() -> None:
    calls: list[list[int]] = []
    base = make_directions("gaussian", {"w": (3, 4)}, 8)

    def counting(seed: int, ks, name: str, shape) -> torch.Tensor:
        calls.append([int(k) for k in ks])
        return base.draw(seed, ks, name, shape)

    dirs = remembered(Directions("gaussian", 8, counting, base.weights), budget_bytes=1 << 20)
    first = dirs.draw(5, [0, 1, 2], "w", (3, 4))
    again = dirs.draw(5, [1, 2, 3], "w", (3, 4))  # 1 and 2 kept, only 3 drawn
    assert calls == [[0, 1, 2], [3]]
    assert torch.equal(first, base.draw(5, [0, 1, 2], "w", (3, 4)))
    assert torch.equal(again, base.draw(5, [1, 2, 3], "w", (3, 4)))
    dirs.draw(6, [0], "w", (3, 4))  # another seed is another direction
    assert calls[-1] == [0]
    # Past the budget nothing is kept: every draw goes to the base again.
    calls.clear()
    tight = remembered(Directions("gaussian", 8, counting, base.weights), budget_bytes=0)
    tight.draw(5, [0], "w", (3, 4))
    tight.draw(5, [0], "w", (3, 4))
    assert calls == [[0], [0]]


class _SmallConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.hardswish(self.conv(x)).flatten(1))


@DRAWS
@pytest.mark.parametrize("kind", ["gaussian", "orthogonal", "block"])
@pytest.mark.parametrize("scheme", ["central", "forward"])
@pytest.mark.parametrize(("path", "workers"), [("batched", 1), ("lean", 1), ("threaded", 2)])
def test_fast_gradient_reusing_draws_is_bit_for_bit_the_two_halves(
    kind: str, scheme: str, path: str, workers: int, draws: str
) -> None:
    # Oracle: the client's loss differences then the server's rebuild, each drawing on its own.
    # A Sequential runs the batched path; any other module the lean loop, threaded with 2 workers.
    g = torch.Generator().manual_seed(1)
    if path == "batched":
        model: nn.Module = nn.Sequential(
            nn.Conv2d(1, 4, 3), nn.Hardswish(), nn.Flatten(), nn.Linear(144, 5)
        )
        masked = "0.weight"
    else:
        model, masked = _SmallConv(), "conv.weight"
    batch = (torch.randn(6, 1, 8, 8, generator=g), torch.randint(0, 5, (6,), generator=g))
    masks = {masked: torch.rand(4, 1, 3, 3, generator=g) < 0.5}
    kw = dict(k=12, sigma=1e-3, seed=9, scheme=scheme, masks=masks, directions=kind, draws=draws)
    diffs = loss_differences(model, F.cross_entropy, batch, mode="fast", workers=workers, **kw)
    want = estimate_gradient(
        dict(model.named_parameters()),
        diffs,
        sigma=1e-3,
        seed=9,
        scheme=scheme,
        masks=masks,
        directions=kind,
        draws=draws,
    )
    got = zeroth_order_gradient(model, F.cross_entropy, batch, mode="fast", workers=workers, **kw)
    assert list(got) == list(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_given_directions_must_match_k() -> None:
    model = nn.Linear(3, 1)
    dirs = make_directions("gaussian", {n: p.shape for n, p in model.named_parameters()}, 4)
    batch = (torch.ones(2, 3), torch.zeros(2))
    with pytest.raises(ConfigError, match="made for k=4, but this step has k=5"):
        loss_differences(
            model, _mean_loss, batch, k=5, sigma=0.1, seed=0, scheme="forward", directions=dirs
        )
    with pytest.raises(ConfigError, match="made for k=4, but this step has k=3"):
        estimate_gradient(
            dict(model.named_parameters()),
            torch.ones(3),
            sigma=0.1,
            seed=0,
            scheme="forward",
            directions=dirs,
        )


def test_given_directions_must_match_the_specs_draws() -> None:
    model = nn.Linear(3, 1)
    dirs = make_directions("gaussian", {n: p.shape for n, p in model.named_parameters()}, 4)
    batch = (torch.ones(2, 3), torch.zeros(2))
    with pytest.raises(ConfigError, match="draw from 'torch' but the spec names draws='portable'"):
        loss_differences(
            model,
            _mean_loss,
            batch,
            k=4,
            sigma=0.1,
            seed=0,
            scheme="forward",
            directions=dirs,
            draws="portable",
        )


# lean keeps one parameter's noise at a time: z_k for W + δ_k, again for W − δ_k, again to rebuild.
@pytest.mark.parametrize(("mode", "draws_per_direction"), [("fast", 1), ("lean", 3)])
def test_fast_gradient_draws_each_direction_once(
    monkeypatch: pytest.MonkeyPatch, mode: str, draws_per_direction: int
) -> None:
    import importlib

    perturbation = importlib.import_module("fedge.estimators.perturbation")
    drawn: dict[str, int] = {}
    real = perturbation.standard_normal_chunk

    def counting(seed: int, ks, name: str, shape) -> torch.Tensor:
        drawn[name] = drawn.get(name, 0) + len(ks)
        return real(seed, ks, name, shape)

    monkeypatch.setattr(perturbation, "standard_normal_chunk", counting)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Hardswish(), nn.Flatten(), nn.Linear(144, 5))
    batch = (torch.randn(6, 1, 8, 8), torch.randint(0, 5, (6,)))
    zeroth_order_gradient(
        model, F.cross_entropy, batch, k=10, sigma=1e-3, seed=3, scheme="central", mode=mode
    )
    assert drawn == {name: 10 * draws_per_direction for name, _ in model.named_parameters()}


def _guided_setup():
    g = torch.Generator().manual_seed(2)
    shapes = {"w": (4, 5), "b": (4,)}
    basis = [{n: torch.randn(s, generator=g) for n, s in shapes.items()} for _ in range(2)]
    return shapes, basis


@DRAWS
def test_guided_directions_lie_in_the_span_with_a_gaussian_s_norm_and_the_rest_fresh(draws):
    """Oracle: the orthonormal basis by numpy's QR. Guided z_k (the last round(share·K)) have no
    component off the span and norm² ≈ n on average (s = sqrt(n / r)); the first K_f are the
    Gaussian draws of ``make_directions("gaussian")``; the weights are 1/K and 1/(K s²)."""
    from fedge.estimators.directions import guided_directions

    shapes, basis = _guided_setup()
    k, share = 1000, 0.4
    dirs = guided_directions(basis, shapes, k, share, draws=draws)
    plain = make_directions("gaussian", shapes, k, draws=draws)
    flat = torch.stack([torch.cat([b[n].reshape(-1) for n in shapes]) for b in basis]).double()
    q, _ = torch.linalg.qr(flat.T)  # (n, r) orthonormal columns
    n, r, kg = 24, 2, 400
    z = torch.cat([dirs.draw(7, range(k), name, s).reshape(k, -1) for name, s in shapes.items()], 1)
    zp = torch.cat(
        [plain.draw(7, range(k), name, s).reshape(k, -1) for name, s in shapes.items()], 1
    )
    assert torch.equal(z[: k - kg], zp[: k - kg])
    guided = z[k - kg :].double()
    off = guided - (guided @ q) @ q.T
    assert float(off.abs().max()) < 1e-5
    assert 0.85 * n < float(guided.square().sum(1).mean()) < 1.15 * n  # E‖z‖² = s²·r = n
    torch.testing.assert_close(
        dirs.weights[: k - kg], torch.full((k - kg,), 1 / k, dtype=torch.float64)
    )
    torch.testing.assert_close(
        dirs.weights[k - kg :], torch.full((kg,), r / (k * n), dtype=torch.float64)
    )
    empty = guided_directions([], shapes, k, share, draws=draws)  # no update yet: BAFFLE's
    ze = torch.cat(
        [empty.draw(7, range(k), name, s).reshape(k, -1) for name, s in shapes.items()], 1
    )
    assert torch.equal(ze, zp)


def test_guided_estimate_bias_is_the_stated_projection_term():
    """Measured bias on a linear loss L = aᵀW (ΔL exact): the mean of ĝ over 600 seeds is
    (K_f/K)·a + (K_g/K)·P a, P the projection on the basis' span, within Monte-Carlo error; the
    plain Gaussian estimate's mean is a."""
    from fedge.estimators import ZerothOrderSpec
    from fedge.estimators.directions import guided_directions

    torch.manual_seed(0)
    model = nn.Linear(6, 1, bias=False)
    g = torch.Generator().manual_seed(4)
    a_x = torch.randn(8, 6, generator=g)
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 6, generator=g))
    shapes = {"weight": (1, 6)}
    basis = [{"weight": torch.randn(1, 6, generator=g)}]
    k, share = 8, 0.5
    dirs = guided_directions(basis, shapes, k, share)
    spec = ZerothOrderSpec(k=k, sigma=1e-2, scheme="forward", directions=dirs)
    grads = torch.stack(
        [
            zeroth_order_gradient(model, _mean_loss, (a_x, torch.zeros(8)), spec, seed=s)[
                "weight"
            ].reshape(-1)
            for s in range(600)
        ]
    ).double()
    a = a_x.mean(0).double()  # ∇ of mean(W·x) over the batch
    b = basis[0]["weight"].reshape(-1).double()
    pa = (a @ b) / (b @ b) * b
    want = 0.5 * a + 0.5 * pa
    err = grads.mean(0) - want
    se = grads.std(0) / math.sqrt(600)
    assert bool((err.abs() < 4 * se + 1e-6).all()), (err, se)
    assert float((want - a).norm()) > 10 * float(se.max())  # the bias is real, and measured


def test_the_server_rebuild_equals_the_client_s_guided_estimate():
    """The client's own estimate (forwards and rebuild on one device) equals the server's rebuild
    from its K scalars with guided directions built independently from the same basis."""
    from fedge.estimators import ZerothOrderSpec
    from fedge.estimators.directions import guided_directions

    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(10, 5, generator=g), torch.randint(0, 2, (10,), generator=g)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    basis = [{n: torch.randn(s, generator=g) for n, s in shapes.items()} for _ in range(3)]

    def spec():
        return ZerothOrderSpec(
            k=12, sigma=1e-3, scheme="forward", directions=guided_directions(basis, shapes, 12, 0.5)
        )

    client = zeroth_order_gradient(model, F.cross_entropy, (x, y), spec(), seed=5)
    diffs = loss_differences(model, F.cross_entropy, (x, y), spec(), seed=5)
    server = estimate_gradient(dict(model.named_parameters()), diffs, spec(), seed=5)
    assert all(torch.equal(client[n], server[n]) for n in shapes)


# --- layer-scaled σ (sigma_scale: layer) ---------------------------------------------------------


def _two_layers(a_weight: float, b_weight: float) -> dict[str, torch.Tensor]:
    """a: Linear(4, 1) with a zero bias, b: Linear(4, 1) without: 5 + 4 coordinates."""
    return {
        "a.weight": torch.full((1, 4), a_weight),
        "a.bias": torch.zeros(1),
        "b.weight": torch.full((1, 4), b_weight),
    }


def test_layer_scales_by_hand() -> None:
    """a's weights all 2 (RMS 2; its zero bias takes it), b's all 0.5: raw scales 2, 2, 0.5; the
    mean of s² over the 9 coordinates, (5·4 + 4·0.25)/9 = 21/9, is divided out: s_a = 6/√21,
    s_b = 1.5/√21 (Σ n_l s_l² = 9). A layer of zeros takes the RMS of all the weights (here
    √(16/9) = 4/3), and masks count only the kept coordinates."""
    from fedge.estimators.directions import layer_scales

    s = layer_scales(_two_layers(2.0, 0.5))
    assert s == pytest.approx(
        {
            "a.weight": 6 / math.sqrt(21),
            "a.bias": 6 / math.sqrt(21),
            "b.weight": 1.5 / math.sqrt(21),
        }
    )
    zero = layer_scales(_two_layers(2.0, 0.0))
    norm = math.sqrt((5 * 4 + 4 * 16 / 9) / 9)
    assert zero["b.weight"] == pytest.approx(4 / 3 / norm) and zero["a.bias"] == pytest.approx(
        2 / norm
    )
    keep_two = {"b.weight": torch.tensor([[True, True, False, False]])}
    masked = layer_scales(_two_layers(2.0, 0.5), keep_two)
    norm = math.sqrt((5 * 4 + 2 * 0.25) / 7)
    assert masked["a.weight"] == pytest.approx(2 / norm) and masked["b.weight"] == pytest.approx(
        0.5 / norm
    )
    with pytest.raises(ConfigError, match="need the perturbed parameters"):
        layer_scales({})


@DRAWS
def test_layer_scaled_draws_are_s_times_the_plain_ones(draws: str) -> None:
    from fedge.estimators.directions import layer_scaled

    shapes = {"a.weight": (1, 4), "a.bias": (1,), "b.weight": (1, 4)}
    base = make_directions("gaussian", shapes, 6, draws=draws)
    scales = {"a.weight": 1.5, "a.bias": 1.5, "b.weight": 0.25}
    scaled = layer_scaled(base, scales)
    assert (scaled.kind, scaled.k, scaled.draws) == (base.kind, base.k, base.draws)
    assert torch.equal(scaled.weights, base.weights)
    for name, shape in shapes.items():
        want = base.draw(3, range(6), name, shape) * scales[name]
        assert torch.equal(scaled.draw(3, range(6), name, shape), want)
    if base.draw_many is not None:
        items = list(shapes.items())
        got = scaled.draw_many(3, 2, items)
        for z, (name, _) in zip(got, items, strict=True):
            assert torch.equal(z, base.draw_many(3, 2, [(name, shapes[name])])[0] * scales[name])
    with pytest.raises(ConfigError, match="no layer scale"):
        scaled.draw(3, [0], "c.weight", (2,))


def test_layer_scaled_estimate_on_a_linear_loss_is_s_squared_times_the_gradient() -> None:
    """A linear loss L = aᵀW (ΔL exact): ĝ = Σ_k (1/K)(S z_k)(S z_k)ᵀ a to the last bits, and its
    mean over 600 seeds is S² a (autograd's gradient times s², within 4 standard errors), not a."""
    from fedge.estimators import ZerothOrderSpec
    from fedge.estimators.directions import layer_scaled, layer_scales

    model, batch, a = _linear_problem()
    with torch.no_grad():
        model.a.weight.mul_(4.0)  # the layers' scales now differ
    params = dict(model.named_parameters())
    shapes = {n: p.shape for n, p in params.items()}
    scales = layer_scales(params)
    k = 6

    def spec() -> ZerothOrderSpec:
        dirs = layer_scaled(make_directions("gaussian", shapes, k), scales)
        return ZerothOrderSpec(k=k, sigma=0.05, scheme="central", directions=dirs)

    base = make_directions("gaussian", shapes, k)
    s = torch.cat([torch.full((math.prod(sh),), scales[n]) for n, sh in shapes.items()]).double()
    grads = []
    for seed in range(600):
        g = zeroth_order_gradient(model, _mean_loss, batch, spec(), seed=seed)
        z = torch.cat([base.draw(seed, range(k), n, sh).view(k, -1) for n, sh in shapes.items()], 1)
        sz = z.double() * s
        if seed < 3:
            want = (sz * (sz @ _flat(a))[:, None]).sum(0) / k
            assert torch.allclose(_flat(g), want, rtol=1e-5, atol=1e-8)
        grads.append(_flat(g))
    grads_t = torch.stack(grads)
    se = grads_t.std(0) / math.sqrt(600)
    err = grads_t.mean(0) - s**2 * _flat(a)
    assert bool((err.abs() < 4 * se + 1e-9).all()), (err, se)
    assert float((s**2 * _flat(a) - _flat(a)).abs().max()) > 10 * float(se.max())


def test_the_server_rebuild_equals_the_client_s_layer_scaled_estimate() -> None:
    """The client's own estimate equals the server's rebuild from its K scalars, each side
    computing the scales from its own copy of the same weights."""
    from fedge.estimators import ZerothOrderSpec
    from fedge.estimators.directions import layer_scaled, layer_scales

    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(10, 5, generator=g), torch.randint(0, 2, (10,), generator=g)

    def spec(m: nn.Module) -> ZerothOrderSpec:
        params = dict(m.named_parameters())
        shapes = {n: p.shape for n, p in params.items()}
        dirs = layer_scaled(make_directions("gaussian", shapes, 12), layer_scales(params))
        return ZerothOrderSpec(k=12, sigma=1e-3, scheme="forward", directions=dirs)

    server_copy = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
    server_copy.load_state_dict(model.state_dict())
    client = zeroth_order_gradient(model, F.cross_entropy, (x, y), spec(model), seed=5)
    diffs = loss_differences(model, F.cross_entropy, (x, y), spec(model), seed=5)
    server = estimate_gradient(
        dict(server_copy.named_parameters()), diffs, spec(server_copy), seed=5
    )
    assert all(torch.equal(client[n], server[n]) for n in client)
