"""The leakage table: every cell comes from running the attack, or says why it cannot."""

from __future__ import annotations

import pytest

from fedge.attacks.table import ROWS, Row, privacy_row

TINY = {
    "dataset": "digits",
    "clients": 2,
    "iterations": 60,
    "mia_clients": 2,
    "mia_per_client": 16,
    "mia_rounds": 1,
    "mia_samples": 16,
    "shadows": 2,
    "pia_clients": 16,
    "test": 200,
}


def test_every_method_has_a_row_and_skips_say_why() -> None:
    names = {r.method["name"] for r in ROWS}
    assert names == {
        "fedavg",
        "fedsgd",
        "baffle",
        "ntk-baffle",
        "fedpt",
        "eppfl",
        "ppfl",
        "fedkseed",
        "decomfl",
        "feedsign",
    }
    for peer in ("fedkseed", "decomfl", "feedsign"):  # the leak without secure aggregation...
        rows = {r.method["secure_aggregation"]: r for r in ROWS if r.method["name"] == peer}
        assert set(rows) == {True, False} and not rows[False].skip
        # ...and with it the harness refuses to read an upload: the cells say why
        assert set(rows[True].skip) == {"dra", "pia"}
    ks = {
        (r.method.get("k"), r.method.get("secure_aggregation"))
        for r in ROWS
        if r.method["name"] == "baffle"
    }
    assert {(k, s) for k in (10, 100, 1000) for s in (True, False)} <= ks
    for r in ROWS:
        assert set(r.skip) <= {"dra", "mia", "pia"} and all(len(v) > 40 for v in r.skip.values())


def test_a_row_runs_every_attack_and_a_skipped_cell_carries_its_reason() -> None:
    row = Row(
        "fedsgd, batch 1",
        {"name": "fedsgd", "batch_size": 1},
        pia_method={"name": "fedsgd", "batch_size": 8},
        skip={"mia": "a reason long enough to be a real explanation of why"},
    )
    out = privacy_row(row, **TINY)
    assert out["dra"]["attack"] == "dlg" and out["dra"]["median_mse"] < out["dra"]["mean_image"]
    assert out["mia"] == {"skipped": row.skip["mia"]}
    assert out["pia"]["uploads"] == 16 and out["pia"]["auc"] > 0.8


@pytest.mark.usefixtures("fake_fashion_mnist")
def test_sealed_ppfl_uploads_are_attacked_as_read() -> None:
    """PPFL's row reads 28x28 images (made ones here: what is checked holds for any images)."""
    row = next(r for r in ROWS if r.method["name"] == "ppfl")
    out = privacy_row(row, **{**TINY, "dataset": "fashion-mnist", "mia_per_client": 8, "test": 100})
    assert (
        out["dra"]["sealed"] and out["dra"]["median_mse"] > out["dra"]["mean_image"]
    )  # ciphertext: nothing
    assert 0 <= out["mia"]["lira"]["auc"] <= 1 and "enclave" in out["pia"]["skipped"]


def test_eppfl_rows_invert_the_edge_servers_activations_and_dp_stops_it() -> None:
    rows = [r for r in ROWS if r.method["name"] == "eppfl"]
    assert sorted((r.method.get("dp") or {}).get("epsilon", 0) for r in rows) == [0, 1.0, 5.0]
    tiny = {**TINY, "iterations": 300}
    skip = {**rows[0].skip, "mia": "a reason long enough to be a real one"}
    plain = privacy_row(Row("eppfl", rows[0].method, model="lenet", skip=skip), **tiny)
    noisy = privacy_row(Row("eppfl dp", rows[-1].method, model="lenet", skip=skip), **tiny)
    assert plain["dra"]["attack"] == "eppfl-inversion"
    assert (
        plain["dra"]["median_mse"] < plain["dra"]["mean_image"] / 100
    )  # no DP: the input comes back
    assert (
        noisy["dra"]["median_mse"] > noisy["dra"]["mean_image"]
    )  # ε = 1 on the activations: nothing
    assert plain["dra"]["upload_bytes"] > 0
    for r in (plain, noisy):  # S_a's view, attacked: the masked M_c upload gives nothing
        assert (
            r["dra"]["server"]["masked"]
            and r["dra"]["server"]["median_mse"] > r["dra"]["server"]["mean_image"]
        )
        assert (
            r["pia"]["uploads"] == TINY["pia_clients"] and 0 <= r["pia"]["auc"] <= 1
        )  # at the edge server
    assert plain["pia"]["epsilon"] is None and noisy["pia"]["epsilon"] == 1.0


def test_dp_rows_clip_what_the_server_sees() -> None:
    dp = [r for r in ROWS if r.privacy]
    assert {(r.method["k"], r.method["secure_aggregation"]) for r in dp} == {
        (10, False),
        (100, False),
        (1000, False),
        (100, True),
    }
    assert all(
        r.privacy["mechanism"] == "gaussian" and r.privacy["noise_multiplier"] > 0 for r in dp
    )
    row = Row(
        "dp",
        {**dp[0].method, "k": 32},
        privacy={**dp[0].privacy, "clip": 1e-4},
        skip={"mia": "a reason long enough to be a real explanation of why"},
    )
    out = privacy_row(row, **TINY)
    assert (
        out["dra"]["clipped"] == 1.0 and out["dra"]["clip"] == 1e-4
    )  # every upload sits at the clip
    assert {"baffle-k", "baffle-k-fit", "baffle-stein"} == set(out["dra"]["all"])
    assert out["pia"]["uploads"] == TINY["pia_clients"]
