"""benchmarks/zo_frontier.py: FLOPs to the target and the Pareto front against hand examples, the
levers and BP reference chosen on validation, the table and verdict rendered from made records,
and units that resume (a recorded unit is never rerun) on a tiny protocol."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests_helpers import benchmark_script

bench = benchmark_script("zo_frontier")


def test_flops_to_reach_is_the_first_evaluated_round_at_the_target() -> None:
    acc = [0.50, None, 0.79, 0.81, 0.80]
    flops = [1e9, 2e9, 3e9, 4e9, 5e9]
    assert bench.flops_to_reach(acc, flops, 0.80) == 4e9  # 0.79 < 0.80; the round of 0.81
    assert bench.flops_to_reach(acc, flops, 0.50) == 1e9
    assert bench.flops_to_reach(acc, flops, 0.82) is None  # not reached


def test_flops_by_round_from_the_probe_or_as_metered() -> None:
    # probe: one client's round costs 1e6; 10 clients a round; evaluated rounds 1, 2 and 5
    result = {"rounds": [1, 2, 5], "cum_client_flops_by_round": [None, None, None]}
    assert bench.flops_by_round(result, 1e6) == [1e7, 2e7, 5e7]
    assert bench.flops_by_round(result, None) is None
    metered = {"rounds": [1, 2], "cum_client_flops_by_round": [3.0, 7.0]}  # a K schedule
    assert bench.flops_by_round(metered, 1e6) == [3.0, 7.0]


def test_pareto_front_by_hand() -> None:
    points = {
        "A": (1.0, 0.50),  # cheapest
        "B": (2.0, 0.70),
        "C": (3.0, 0.60),  # B costs less and reaches more
        "D": (2.0, 0.65),  # B costs as much and reaches more
        "E": (10.0, 0.80),  # most accurate
        "F": (10.0, 0.80),  # a tie with E: neither dominates the other
    }
    assert bench.pareto(points) == ["A", "B", "E", "F"]


# --- made records --------------------------------------------------------------------------------


def _curve(final: float, rounds: int = 20) -> list[float]:
    return [round(final * (r + 1) / rounds, 6) for r in range(rounds)]


def _result(final: float, *, val: float | None = None, up: float = 1e5) -> dict:
    rounds = list(range(1, 21))
    return {
        "rounds": rounds,
        "test_accuracy_by_round": _curve(final),
        "val_accuracy_by_round": _curve(final if val is None else val),
        "cum_client_flops_by_round": [None] * 20,
        "cum_bytes_up_per_client_by_round": [up * r for r in rounds],
        "cum_bytes_down_per_client_by_round": [up * r for r in rounds],
        "client_tensor_peak_bytes": None,
        "forward_mode_ad": False,
        "client_flops_round1": None,
        "wall_s": 1.0,
    }


def _write(records: Path, label: str, unit: str, result: dict) -> None:
    p = records / bench.slug(label) / f"{unit}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"config": {}, "result": result}))


def _screen(records: Path, label: str, vals: dict[float, float]) -> None:
    for lr, v in vals.items():
        _write(records, label, f"lr={lr:g}", _result(v))


MID = {0.001: 0.70, 0.003: 0.80, 0.01: 0.75}  # best in the middle: the grid does not grow


def _made(records: Path) -> None:
    _screen(records, "BP FedAvg", MID)
    _screen(records, "BP FedAvg, persistent Adam", {lr: v - 0.01 for lr, v in MID.items()})
    _screen(records, "BAFFLE K=100", MID)
    for seed, (bp, zo) in enumerate([(0.83, 0.69), (0.82, 0.70), (0.84, 0.71)]):
        _write(records, "BP FedAvg", f"seed-{seed}", _result(bp))
        _write(records, "BAFFLE K=100", f"seed-{seed}", {**_result(zo), "wall_s": 3.0 + seed})
    # one client's round: BP 1e8 FLOPs, BAFFLE 5e9 (x 10 clients x 20 rounds for the run)
    _write(records, "BP FedAvg", "probe", {**_result(0.1), "client_flops_round1": 1e8})
    probe = {**_result(0.1), "client_flops_round1": 5e9, "client_tensor_peak_bytes": 2.5e6}
    _write(records, "BAFFLE K=100", "probe", probe)


def test_the_table_and_verdict_from_made_records(tmp_path: Path) -> None:
    _made(tmp_path)
    text, agg = bench.table(tmp_path, methods=[])
    # the BP reference is the better recipe on validation (fresh: 0.80 > persistent's 0.79)
    assert (
        "BP reference (the better BP FedAvg recipe on validation): BP FedAvg; target 0.8200" in text
    )
    assert agg["BP FedAvg"]["mean"] == pytest.approx(0.83)
    assert agg["BAFFLE K=100"]["total_flops"] == pytest.approx(5e9 * 10 * 20)
    # BAFFLE's best is 0.71 < the target 0.82: not reached
    assert (
        "| BAFFLE K=100 | 0.003 | 3 | 0.7000 ± 0.0100 | not reached (best 0.7100) | 1.00e+12 |"
        in text
    )
    # BP reaches 0.82 on seed 0 (curve r/20 x 0.83) at round 20, seed 1 (0.82) at 20, seed 2 at 20:
    # 0.84 x 20/20 = 0.84, 0.84 x 19/20 = 0.798 < 0.82 -> round 20 on every seed: 2e10
    assert (
        "| BP FedAvg (BP reference) | 0.003 | 3 | 0.8300 ± 0.0100 | 2.00e+10 | 2.00e+10 |" in text
    )
    assert "| 2.50 |" in text  # BAFFLE's client memory, MB
    assert "| BAFFLE + persistent Adam | awaiting screen | 0 | awaiting records | | | | - |" in text
    assert "Levers combined (each beat BAFFLE K=100's screen on validation): awaiting" in text
    assert (
        "Verdict: the best forward-only row is BAFFLE K=100 at 0.7000, 13.00 points below BP "
        "(BP FedAvg, 0.8300) at 50.0x its total client FLOPs (its runs took 4.0x BP's wall time "
        "by the records, one core each, evaluation included): the 1-point / 10x target is not met; no inference-only row "
        "runs within 10x BP's total client FLOPs." in text
    )
    # a forward-only row with one seed recorded, better than BAFFLE, is not yet named
    _screen(tmp_path, "BAFFLE + persistent Adam", MID)
    _write(tmp_path, "BAFFLE + persistent Adam", "seed-0", _result(0.80))
    text, _ = bench.table(tmp_path, methods=[])
    assert "Verdict: the best forward-only row is BAFFLE K=100 at 0.7000" in text
    # a cheaper inference-only row (one client's round 5e8: 5x BP's) is the frontier at the budget
    fedzo = "FedZO (BAFFLE epoch, forward, K=20, SGD)"
    _screen(tmp_path, fedzo, {0.01: 0.6, 0.03: 0.65, 0.1: 0.62})
    for seed, acc in enumerate([0.64, 0.65, 0.66]):
        _write(tmp_path, fedzo, f"seed-{seed}", _result(acc))
    _write(tmp_path, fedzo, "probe", {**_result(0.1), "client_flops_round1": 5e8})
    text, _ = bench.table(tmp_path, methods=[])
    assert (
        "within 10x BP's total client FLOPs the best inference-only row is "
        f"{fedzo} at 0.6500, 18.00 points below BP (5.0x)." in text
    )


def test_no_records_render_as_awaiting(tmp_path: Path) -> None:
    text, _ = bench.table(tmp_path, methods=["fedkseed"])
    assert "| FedKSeed | awaiting screen | 0 | awaiting records |" in text
    assert "Verdict: awaiting records (the BP reference and at least one forward-only row)." in text
    assert text.endswith("none recorded.")  # no unit's minutes


def test_levers_and_their_combination_are_chosen_on_validation(tmp_path: Path) -> None:
    _made(tmp_path)
    _screen(tmp_path, "BAFFLE + persistent Adam", {lr: v + 0.02 for lr, v in MID.items()})
    _screen(tmp_path, "BAFFLE + mask 10% magnitude", {lr: v - 0.02 for lr, v in MID.items()})
    _screen(tmp_path, "BAFFLE + fc1 frozen, prefix once", MID)  # a tie does not beat it
    _screen(tmp_path, "BAFFLE + σ decay 0.9, K 100→200", {lr: v + 0.001 for lr, v in MID.items()})
    _screen(tmp_path, "BAFFLE + layer-scaled σ", {lr: v - 0.001 for lr, v in MID.items()})
    state = bench.read_records(tmp_path, [])
    assert bench.chosen_levers(state["screens"]) == ["persistent Adam", "σ decay 0.9, K 100→200"]
    combo = state["rows"][bench.COMBO]
    assert combo.overrides == (
        "method.k=100",
        "method.client_optimizer.state=persistent",
        "method.sigma_decay=0.9",
        "method.k_final=200",
    )
    warm = state["rows"][bench.COMBO_WARM]  # the same levers from the warm-start rows' start
    assert warm.overrides == (*combo.overrides, *bench.WARM_START)
    assert bench.pending(warm, state["screens"]) == []
    jvp = state["rows"][bench.COMBO_JVP]  # the same levers, K's ramp left to BAFFLE's K
    assert jvp.overrides[-2:] == (
        "method.client_optimizer.state=persistent",
        "method.sigma_decay=0.9",
    )
    # BP on the same trainable set takes the BP reference's state (fresh here)
    assert "method.client_optimizer.state=persistent" not in state["rows"][bench.BP_MASK].overrides
    assert bench.pending(combo, state["screens"]) == []


def test_a_grid_grows_past_a_winning_edge() -> None:
    row = bench.base_rows()["BP FedAvg"]
    edge = {0.001: {"val_accuracy_by_round": [0.6]}, 0.003: {"val_accuracy_by_round": [0.7]}}
    edge[0.01] = {"val_accuracy_by_round": [0.8]}
    assert bench.grid(row, edge) == (0.001, 0.003, 0.01, 0.03)
    assert bench.picked(row, edge) is None  # 0.03 is not screened yet


def test_every_row_loads_as_a_config() -> None:
    """Every row's overrides, with the protocol, make a valid config (a typo fails here, not
    hours into a run)."""
    from fedge.core.config import load_config
    from fedge.experiment.build import resolved_config
    from fedge.methods import method_names

    screens: dict = {}  # the peers registered now (DeComFL, FeedSign once they land) included
    for row in bench.rows(screens, method_names()).values():
        for unit in ("screen", "seed-0", "probe"):
            cfg = load_config(bench.BASE, overrides=bench.unit_overrides(row, row.lrs[0], unit))
            node = resolved_config(cfg)  # the method's own consistency rules too
            for part in row.lr_key.split("."):
                node = node[part]
            assert node == row.lrs[0], f"{row.label}: {row.lr_key} is not the screened lr"


# --- units run and resume on a tiny protocol -----------------------------------------------------

TINY = [
    "threads=1",
    "rounds=2",
    "clients.num=2",
    "clients.per_round=2",
    "dataset.limit_train=120",
    "dataset.validation=40",
    "dataset.limit_test=50",
    "model.name=mlp",
    "model.hidden=[4]",
    "model.activation=relu",
    "model.norm=none",
    "method.batch_size=20",
    "measure.flops=false",
]


@pytest.mark.usefixtures("fake_fashion_mnist")
def test_the_compressed_bp_row_uploads_the_top_1_percent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BP FedAvg with top-k 1% and error feedback (the slow-uplink comparison of issue 44): its
    probe, on a tiny protocol (d = 784x4 + 4 + 4x10 + 10 = 3,190), uploads k = round(0.01 d) = 32
    coordinates at 8 bytes each plus the message's framing (about a hundred bytes of names and
    config), where BP FedAvg uploads 4d."""
    from fedge.core.config import load_config
    from fedge.experiment.build import resolved_config

    monkeypatch.setattr(bench, "PROTOCOL", TINY)
    row = bench.base_rows()[bench.BP_TOPK]
    overrides = bench.unit_overrides(row, 0.003, "probe")
    method = resolved_config(load_config(bench.BASE, overrides=overrides))["method"]
    assert method["compress"]["name"] == "topk" and method["compress"]["ratio"] == 0.01
    assert method["compress"]["error_feedback"] is True and method["secure_aggregation"] is False
    up = {}
    for label in ("BP FedAvg", bench.BP_TOPK):
        r = bench.base_rows()[label]
        got = bench.run_unit(
            bench.unit_overrides(r, 0.003, "probe"),
            tmp_path / f"probe{len(up)}.json",
            tmp_path / f"run{len(up)}",
        )
        up[label] = got["cum_bytes_up_per_client_by_round"][0]
    d = 784 * 4 + 4 + 4 * 10 + 10
    assert up["BP FedAvg"] >= 4 * d
    assert 8 * 32 <= up[bench.BP_TOPK] <= 8 * 32 + 128, up  # framing: ~100 bytes


@pytest.mark.usefixtures("fake_fashion_mnist")
def test_units_resume_and_a_recorded_unit_is_not_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "PROTOCOL", TINY)
    monkeypatch.setattr(bench, "SCREEN_ROUNDS", 1)
    records, out = tmp_path / "records", tmp_path / "runs"
    # a budget of 0 minutes starts no unit
    left = bench.run_all(records, out, only_rows=["BP FedAvg"], seeds=[0], max_minutes=0)
    assert left == ["BP FedAvg: screen (time budget spent)"] and not records.exists()
    left = bench.run_all(records, out, only_rows=["BP FedAvg"], seeds=[0])
    assert left == []
    folder = records / bench.slug("BP FedAvg")
    files = sorted(p.name for p in folder.glob("*.json"))
    assert "seed-0.json" in files and "probe.json" in files
    assert sum(f.startswith("lr=") for f in files) >= 3
    seed0 = json.loads((folder / "seed-0.json").read_text())
    assert len(seed0["result"]["test_accuracy_by_round"]) == 2
    assert seed0["config"]["seed"] == 0
    probe = json.loads((folder / "probe.json").read_text())["result"]
    assert probe["client_flops_round1"] > 0  # the probe meters one client's round

    def never(*a: object, **k: object) -> None:
        raise AssertionError("a recorded unit ran again")

    import fedge.experiment.run

    monkeypatch.setattr(fedge.experiment.run, "run_experiment", never)
    assert bench.run_all(records, out, only_rows=["BP FedAvg"], seeds=[0]) == []
    assert json.loads((folder / "seed-0.json").read_text()) == seed0
    # a record made before a neutral key existed (here: the fairness split) is still this unit's,
    # and a record of another protocol is refused naming the file
    old = json.loads(json.dumps(seed0))
    del old["config"]["partition"]["local_test"], old["config"]["local_eval_every"]
    (folder / "seed-0.json").write_text(json.dumps(old))
    assert bench.run_all(records, out, only_rows=["BP FedAvg"], seeds=[0]) == []
    old["config"]["rounds"] = 3
    (folder / "seed-0.json").write_text(json.dumps(old))
    with pytest.raises(bench.ConfigError, match="seed-0.json records another config"):
        bench.run_all(records, out, only_rows=["BP FedAvg"], seeds=[0])
    (folder / "seed-0.json").write_text(json.dumps(seed0))
    # a dependent row waits for the screens it needs
    left = bench.run_all(records, out, only_rows=[bench.BP_MASK], seeds=[0])
    assert left == [
        f"{bench.BP_MASK}: waits for the screens of BP FedAvg, BP FedAvg, persistent Adam"
    ]


def test_the_figure_marks_the_front_on_flops(tmp_path: Path) -> None:
    _made(tmp_path / "records")
    _, agg = bench.table(tmp_path / "records", methods=[])
    every = bench.read_records(tmp_path / "records", [])["rows"]
    path = tmp_path / "frontier.png"
    front = bench.figure(agg, every, path)
    # BP costs 2e10 and reaches 0.83; BAFFLE costs 1e12 for 0.70: BP dominates it
    assert front == ["BP FedAvg"]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_activity_row_is_listed_and_judged_apart(tmp_path: Path) -> None:
    """Activity perturbation forms each layer's weight gradient on the client (not inference-only):
    its row sits under its own title, and the verdict names its best row on a line of its own
    rather than as the best forward-only (inference-only) row."""
    _made(tmp_path)
    row = bench.base_rows()[bench.ACTIVITY]
    assert row.kind == "activity"
    assert row.overrides == (f"method.k={bench.ACTIVITY_K}", "method.estimator=activity")
    for seed, acc in enumerate([0.80, 0.81, 0.82]):
        _write(tmp_path, bench.ACTIVITY, f"seed-{seed}", _result(acc))
    _write(tmp_path, bench.ACTIVITY, "probe", {**_result(0.1), "client_flops_round1": 2e8})
    text, agg = bench.table(tmp_path, methods=[])
    title = text.index(f"| **{bench.KIND_TITLE['activity']}** |")
    assert text.index(f"| {bench.ACTIVITY} |") > title > text.index("| BAFFLE K=100 |")
    assert "the best forward-only row is BAFFLE K=100 at 0.7000" in text
    assert (
        f"the best activity-perturbation row is {bench.ACTIVITY} at 0.8100, 2.00 points below BP "
        "(BP FedAvg, 0.8300) at 2.0x its total client FLOPs (its runs took 1.0x BP's wall time "
        "by the records, one core each, evaluation included): the 1-point / 10x target is not met"
        in text
    )
    # its cost estimate counts the clean forward, the local maps and K directions on the suffix
    est = bench.estimate(row)
    per = (
        bench.FLOP_PER_SAMPLE["activity_fixed"] + 100 * bench.FLOP_PER_SAMPLE["activity_direction"]
    )
    assert per == 174_672.0  # torch's counter on one client's round, per training sample
    assert est["flops"] < bench.estimate(bench.base_rows()["BAFFLE K=100"])["flops"]


# --- warm start rows -----------------------------------------------------------------------------


def test_the_warm_start_rows_share_one_start_and_the_other_rows_clients() -> None:
    """BP FedAvg and BAFFLE K=100 warm-started: the same warm_start block (so the same server
    pretraining), and the clients' data, validation and model seed of the other rows."""
    from fedge.core.config import load_config
    from fedge.experiment.build import resolved_config

    rows = bench.base_rows()

    def config(label: str) -> dict:
        row = rows[label]
        return resolved_config(
            load_config(bench.BASE, overrides=bench.unit_overrides(row, 0.001, "seed-0"))
        )

    bp, zo, plain = config(bench.WARM_BP), config(bench.WARM_BAFFLE), config("BP FedAvg")
    assert bp["warm_start"] == zo["warm_start"]
    assert bp["warm_start"]["public"] == bench.PUBLIC == 2_000
    assert bp["warm_start"]["source"] == "unused"  # from what limit_train leaves out
    for key in ("dataset", "partition", "clients", "model", "seed", "draws"):
        assert bp[key] == zo[key] == plain[key], key
    assert "warm_start" not in plain
    assert {k: v for k, v in bp.items() if k != "warm_start"} == plain
    assert rows[bench.WARM_BP].kind == "bp" and rows[bench.WARM_BAFFLE].kind == "zo"


def test_the_warm_start_note_states_the_public_size_and_server_flops(tmp_path: Path) -> None:
    assert bench.warm_start_note(bench.read_records(tmp_path, [])).endswith(
        "server FLOPs: awaiting records."
    )
    warm = {"public": 2000, "server_flops": 1.02272e9, "source": "unused"}
    for seed in range(3):
        _write(tmp_path, bench.WARM_BAFFLE, f"seed-{seed}", {**_result(0.8), "warm_start": warm})
    text, _ = bench.table(tmp_path, methods=[])
    assert (
        "server pretraining FLOPs 1.02e+09 a run (torch's counter; not in the client FLOPs "
        "above), public set 2,000 samples." in text
    )
    assert f"| {bench.WARM_BAFFLE} | awaiting screen | 3 | 0.8000 ± 0.0000 |" in text


@pytest.mark.usefixtures("fake_fashion_mnist")
def test_a_warm_start_unit_records_the_server_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = bench.Row(
        "warm",
        "bp",
        (*bench.BP, "warm_start={public: 30, source: unused, epochs: 1, batch_size: 10}"),
    )
    tiny = [
        "threads=1",
        "rounds=1",
        "clients.num=2",
        "clients.per_round=2",
        "dataset.limit_train=120",
        "dataset.validation=40",
        "dataset.limit_test=50",
        "model.name=mlp",
        "model.hidden=[4]",
        "method.batch_size=20",
        "measure.flops=false",
    ]
    monkeypatch.setattr(bench, "PROTOCOL", tiny)
    result = bench.run_unit(
        bench.unit_overrides(row, 0.001, "seed-0"), tmp_path / "r.json", tmp_path / "run"
    )
    assert result["warm_start"]["public"] == 30 and result["warm_start"]["server_flops"] > 0
    assert result["warm_start"]["clients_samples"] == 80  # 120 kept less 40 for validation


def test_estimate_quality_of_a_small_mlp_against_autograd() -> None:
    """``--quality`` on a 12-6-3 MLP: d_z counts the estimated layers' outputs (6 + 3); with K far
    above d_z the activity estimate nearly equals autograd's gradient, with K = 100 above n = 99
    BAFFLE's is close as well; FLOPs over BP's are torch's counter's: BAFFLE K = 100 runs 101
    forwards (a forward is 2·(12·6 + 6·3) = 180 FLOP a sample); BP's 396 is the forward, both
    weight gradients (180) and the hidden layer's input gradient (2·6·3 = 36; none for the input)."""
    import torch

    from fedge.models import build_model

    torch.manual_seed(0)
    net = build_model("mlp", input_shape=(12,), num_classes=3, seed=0, hidden=[6], norm="none")
    x, y = torch.randn(20, 12), torch.randint(0, 3, (20,))
    q = bench.model_quality(net, x, y, repeats=2)
    assert (q["n"], q["d_z"]) == (12 * 6 + 6 + 6 * 3 + 3, 9)
    est = q["estimators"]
    assert est["activity K=100 (layer outputs)"]["cos_mean"] > 0.95
    assert est["BAFFLE K=100 (weights)"]["cos_mean"] > 0.6
    assert (
        est["activity K=100 (layer outputs)"]["cos_mean"]
        > est["activity K=25 (layer outputs)"]["cos_mean"]
    )
    assert est["BAFFLE K=100 (weights)"]["flops_per_sample"] == 101 * 180
    assert q["bp_flops_per_sample"] == 180 + 180 + 36
    assert est["BAFFLE K=100 (weights)"]["flops_over_bp"] == pytest.approx(101 * 180 / 396)


def test_estimate_quality_with_a_local_head_on_a_small_lenet(monkeypatch) -> None:
    """With a head after conv1's block the activity estimates cost a fraction of the head-free
    ones' FLOPs (conv1's perturbed forwards stop at the head), carry their cosine with the local
    objective's exact gradient, and the record states how far that gradient is from the global
    one; every estimate has its wall time over BP's."""
    import torch

    from fedge.models import build_model

    net = build_model("lenet", input_shape=(1, 12, 12), num_classes=10, seed=0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 1, 12, 12, generator=g), torch.randint(0, 10, (6,), generator=g)
    cells = {  # conv1's block outputs 6 x 6 here: 3 x 3 patches (the record's 7 x 7 need 14 x 14)
        "activity K=100, local head after conv1, 16 loss groups": (100, 16, 1),
        "activity K=100, local head after conv1, 16 loss groups x 3x3 patches": (100, 16, 3),
    }
    monkeypatch.setattr(bench, "QUALITY_GROUP_ESTIMATORS", cells)
    every = {"activity K=25, local heads after conv1 and conv2, 16 x 3x3": (25, 16, 3)}
    monkeypatch.setattr(bench, "QUALITY_EVERY_BLOCK_ESTIMATORS", every)
    q = bench.model_quality(
        net, x, y, repeats=2, heads_at=("features.conv1",),
        every_block=("features.conv1", "features.conv2"),
    )  # fmt: skip
    est = q["estimators"]
    headed, plain = (
        est["activity K=25, local head after conv1"],
        est["activity K=25 (layer outputs)"],
    )
    assert headed["flops_over_bp"] < plain["flops_over_bp"] / 2
    assert -1 <= headed["cos_local_mean"] <= 1 and "cos_local_mean" not in plain
    exact = est["local objective's exact gradient"]
    assert 0 < exact["cos_mean"] < 1 and -1 <= exact["cos_first_layer"] <= 1
    assert all(e["wall_over_bp"] > 0 for e in est.values() if "cos_std" in e)
    # cell losses: each with its own objective's exact gradient; at the same K, 16 groups (one
    # loss a channel) come closer to theirs than 1 loss a head does to its own
    for label, (_, groups, patches) in cells.items():
        assert -1 <= est[label]["cos_local_mean"] <= 1
        assert bench._exact_label(groups, patches) in est
    assert "local objective's exact gradient, 16 loss groups, 3x3 patches" in est
    # heads closing both conv blocks: their own objective, with its exact gradient beside it
    both = est["activity K=25, local heads after conv1 and conv2, 16 x 3x3"]
    assert -1 <= both["cos_local_mean"] <= 1 and -1 <= both["cos_local_first_layer_mean"] <= 1
    exact_both = "local objective's exact gradient, local heads after conv1 and conv2"
    assert f"{exact_both}, 16 loss groups, 3x3 patches" in est
    assert (
        est["activity K=100, local head after conv1, 16 loss groups"]["cos_local_mean"]
        > est["activity K=100, local head after conv1"]["cos_local_mean"]
    )


def test_the_quality_note_renders_its_record(tmp_path: Path) -> None:
    est = {
        name: {"cos_mean": c, "cos_std": 0.01, "flops_per_sample": 1.0, "flops_over_bp": r}
        for name, c, r in zip(
            bench.QUALITY_ESTIMATORS, (0.06, 0.04, 0.9, 0.5), (34.0, 33.0, 33.2, 9.0), strict=True
        )
    }
    models = {
        m: {"n": 100, "d_z": 42, "bp_flops_per_sample": 1.0, "estimators": est}
        for m in bench.QUALITY_MODELS
    }
    record = {"config": {"batch": 20, "repeats": 5, "sigma": 1e-4}, "result": {"models": models}}
    assert "awaiting its record" in bench.quality_note(tmp_path)
    (tmp_path / bench.QUALITY.name).write_text(json.dumps(record))
    note = bench.quality_note(tmp_path)
    assert "activity K=25 (layer outputs) 0.500 ± 0.010 at 9.0x BP's FLOPs" in note
    assert "(33.2x at K = 100; 9.0x at K = 25, cosine 0.500)" in note
