"""Membership inference against a run: members only from the clients it trained on, the
run's own intermediate models, shadow models trained the same way (through the real engine)."""

from __future__ import annotations

import pytest

from fedge.attacks.harness import attack_config


def test_shadow_models_train_on_the_attackers_data_with_the_runs_method() -> None:
    import torch

    from fedge.attacks.membership_run import _run_rounds, membership_attacks
    from fedge.experiment.build import build_run

    method = {"name": "fedavg", "local_epochs": 1, "batch_size": 8}
    cfg = attack_config(
        method, clients=2, per_client=20, dataset="digits", test=120, rounds=2, model="lenet"
    )
    built = build_run(cfg)
    target = _run_rounds(built, cfg.rounds)
    r = membership_attacks(built, target, samples=30, shadows=2)
    assert r["shadows"] == 2 and r["shadow_train_size"] == 40  # min(40 training samples, 90 // 2)
    for key in ("loss", "shadow", "lira"):
        assert 0 <= r[key]["auc"] <= 1 and r[key]["members"] == r[key]["non_members"] == 30
    from fedge.attacks.membership_run import shadow_models

    ds = built.dataset
    ((m0, inside, outside),) = shadow_models(cfg, (ds.x_test, ds.y_test), train_size=40, shadows=1)
    train = {tuple(v.flatten().tolist()) for v in ds.x_train}
    assert not any(tuple(v.flatten().tolist()) in train for v in torch.cat([inside[0], outside[0]]))
    assert not all(
        torch.equal(a, b) for a, b in zip(m0.parameters(), target.parameters(), strict=True)
    )


def test_round_models_are_the_runs_own_models_and_shadows_follow_the_rounds() -> None:
    import torch

    from fedge.attacks.membership_run import (
        _run_rounds,
        membership_attacks,
        membership_by_round,
        round_models,
    )
    from fedge.experiment.build import build_run

    method = {"name": "fedavg", "local_epochs": 1, "batch_size": 8}
    cfg = attack_config(
        method, clients=2, per_client=20, dataset="digits", test=120, rounds=3, model="lenet"
    )
    ms = round_models(build_run(cfg), [3, 1])
    for r in (1, 3):  # an independent run of r rounds gives the same model
        ref = _run_rounds(build_run(cfg.model_copy(update={"rounds": r})), r)
        for (n, a), b in zip(ms[r].state_dict().items(), ref.state_dict().values(), strict=True):
            assert torch.equal(a, b), n
    built = build_run(cfg)
    by = membership_by_round(built, [1, 3], samples=30, shadows=2)
    final = membership_attacks(build_run(cfg), ms[3], samples=30, shadows=2)
    for key in (
        "loss",
        "shadow",
        "lira",
    ):  # round 3 = the final model against shadows trained 3 rounds
        assert by["rounds"]["3"][key] == final[key]
    assert by["rounds"]["1"]["loss"] != by["rounds"]["3"]["loss"]


def _sampled_config(*, clients: int, per_client: int, per_round: int, rounds: int, test: int = 60):  # noqa: ANN202
    cfg = attack_config(
        {"name": "fedavg", "local_epochs": 1, "batch_size": 4},
        clients=clients,
        per_client=per_client,
        dataset="digits",
        model="lenet",
        test=test,
        rounds=rounds,
    )
    return cfg.model_copy(
        update={"clients": cfg.clients.model_copy(update={"per_round": per_round})}
    )


def _capture_members(monkeypatch: pytest.MonkeyPatch) -> list:
    """The (members, non-members) every loss-threshold attack is handed."""
    import fedge.attacks.membership as membership

    seen: list = []
    real = membership.loss_threshold_attack

    def spy(model, members, non_members):  # noqa: ANN001, ANN202
        seen.append((members, non_members))
        return real(model, members, non_members)

    monkeypatch.setattr(membership, "loss_threshold_attack", spy)
    return seen


def _rows(x) -> set:  # noqa: ANN001
    return {tuple(v.flatten().tolist()) for v in x}


def test_mia_members_are_samples_of_clients_the_model_trained_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prepare: 4 clients, 1 sampled a round, 2 rounds, so at least 2 clients never train
    (oracle: the engine's sampler). Assert: every member of the final-model attack is a sample
    of a client sampled in round 1 or 2, and every member of the per-round attack (rounds 1
    and 2 alike) one of round 1's client; the shadows' training sets follow the same rule."""
    from fedge.attacks.membership_run import membership_attacks, membership_by_round, replay
    from fedge.experiment.build import build_run
    from fedge.runtime.engine import sample_clients

    cfg = _sampled_config(clients=4, per_client=5, per_round=1, rounds=2)
    picked = {r: sample_clients(cfg.seed, r, 4, 1) for r in (1, 2)}
    ever = sorted(set(picked[1]) | set(picked[2]))
    assert len(ever) < 4
    first = replay(build_run(cfg), [2]).first_aggregated
    assert first == {c: min(r for r in (1, 2) if c in picked[r]) for c in ever}
    seen = _capture_members(monkeypatch)
    built = build_run(cfg)
    x = built.dataset.x_train
    rows = {c: _rows(x[built.clients[c].indices]) for c in range(4)}
    final = membership_attacks(
        built, replay(build_run(cfg), [2]).models[2], samples=5 * len(ever), shadows=1
    )
    assert (
        final["loss"]["members"] == 5 * len(ever) and final["shadow_train_size"] <= 10
    )  # 2 of 4 shadow clients at most
    ((members, _),) = seen
    assert _rows(members[0]) == set().union(
        *(rows[c] for c in ever)
    )  # all of them, none of the others
    seen.clear()
    membership_by_round(build_run(cfg), [1, 2], samples=5)
    assert len(seen) == 2 and all(_rows(m[0]) == rows[picked[1][0]] for m, _ in seen)


def test_mia_members_with_every_client_are_the_draws_of_every_clients_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every client trains every round: the members and non-members are exactly the old
    draws (the published tables' figures), from every client's samples concatenated."""
    import torch

    from fedge.attacks.membership_run import membership_attacks, membership_by_round, replay
    from fedge.core.rng import generator
    from fedge.experiment.build import build_run

    cfg = _sampled_config(clients=3, per_client=6, per_round=3, rounds=2)
    built = build_run(cfg)
    ds = built.dataset
    idx = torch.cat(
        [c.indices for c in built.clients]
    )  # the formula before participation was minded
    g = generator(0, "attack", "mia")
    members = idx[torch.randperm(len(idx), generator=g)[:7]]
    non = torch.randperm(len(ds.y_test), generator=g)[:7]
    seen = _capture_members(monkeypatch)
    membership_attacks(built, replay(build_run(cfg), [2]).models[2], samples=7)
    membership_by_round(build_run(cfg), [1, 2], samples=7)
    assert len(seen) == 3
    for (mx, my), (nx, ny) in seen:
        assert torch.equal(mx, ds.x_train[members]) and torch.equal(my, ds.y_train[members])
        assert torch.equal(nx, ds.x_test[non]) and torch.equal(ny, ds.y_test[non])


def test_mia_by_round_with_too_few_members_by_the_first_round_names_the_ways_out() -> None:
    """One client of 4 trained by round 1 holds 5 samples: 6 members is a ConfigError naming
    the value and the fixes; 5 runs."""
    from fedge.attacks.membership_run import membership_by_round
    from fedge.core.errors import ConfigError
    from fedge.experiment.build import build_run

    cfg = _sampled_config(clients=4, per_client=5, per_round=1, rounds=2)
    with pytest.raises(
        ConfigError, match=r"samples=6 .*1 of 4 clients aggregated by round 1 hold 5 samples"
    ) as e:
        membership_by_round(build_run(cfg), [1, 2], samples=6)
    for fix in ("at most 5", "later first round than 1", "clients.per_round=4"):
        assert fix in str(e.value)
    assert (
        membership_by_round(build_run(cfg), [1, 2], samples=5)["rounds"]["2"]["loss"]["members"]
        == 5
    )


def test_the_example_rounds_are_rounds_of_the_run():
    from fedge.attacks.membership_run import example_rounds

    assert [example_rounds(n) for n in (1, 2, 3, 10, 11)] == [
        "1",
        "1,2",
        "1,2,3",
        "1,5,10",
        "1,6,11",
    ]


def test_trained_clients_read_the_runs_record_and_replay_only_without_it() -> None:
    """With ``first_aggregated`` in the summary the record answers (no replay); without it the
    run is re-run and its own record read, after ``before_replay``. Oracle: a run whose clients
    are sampled (2 of 4 a round, 1 round) trained on exactly the clients the replay aggregated."""
    from fedge.attacks.membership_run import replay, trained_clients
    from fedge.experiment.build import build_run

    cfg = attack_config(
        {"name": "fedsgd", "batch_size": 1}, clients=4, per_client=1, dataset="digits"
    )
    cfg = cfg.model_copy(update={"clients": cfg.clients.model_copy(update={"per_round": 2})})
    called: list[bool] = []
    record = {"3": 1, "0": 1, "2": 5}
    assert trained_clients(
        build_run(cfg), {"first_aggregated": record}, lambda: called.append(True)
    ) == [0, 3]
    assert not called
    got = trained_clients(build_run(cfg), {}, lambda: called.append(True))
    assert called == [True]
    assert got == replay(build_run(cfg), [1]).trained_by(1) and len(got) == 2


def test_attack_name_says_what_was_measured() -> None:
    from fedge.attacks.membership_run import attack_name

    assert attack_name(0) == "loss-threshold (Yeom et al. 2018)"
    assert "completed with a classifier" in attack_name(0, withheld=True)
    assert "offline LiRA" in attack_name(2) and "Shokri" in attack_name(2)
    assert attack_name(0, by_round=True).endswith("(the run re-run from its config)")
    assert "LiRA" not in attack_name(0, by_round=True) and "LiRA" in attack_name(1, by_round=True)
