"""The time model through a whole run: config validation of device profiles (every field
used or refused), named devices, summaries and report plots, secure aggregation's stragglers."""

import json
import warnings

import pytest

import fedge
from fedge.core.config import load_config
from fedge.core.device_profiles import DEVICES
from fedge.core.errors import ConfigError
from fedge.experiment.build import build_run

MID = {"device": "phone-mid", "fraction": 0.75}
ALL = {"device": "phone-mid", "fraction": 1.0}
SLOW = {"name": "slow", "device": "iot", "uplink_kbps": 1, "fraction": 0.25}


def test_a_named_device_fills_its_figures_and_a_given_field_overrides(tiny):
    cfg = load_config(tiny(**{"clients.profiles": [MID, SLOW]}))
    mid, slow = cfg.clients.profiles
    assert (mid.name, mid.gflops, mid.downlink_kbps, mid.uplink_kbps) == (
        "phone-mid",
        3,
        6000,
        2000,
    )
    assert (slow.name, slow.gflops, slow.uplink_kbps) == ("slow", DEVICES["iot"].gflops, 1)
    assert all(d.source for d in DEVICES.values())  # every figure says where it comes from


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            {"clients.profiles": [{"name": "a", "fraction": 1.0, "uplink_kbps": 5}]},
            "gives no gflops",
        ),
        (
            {"clients.profiles": [{"name": "a", "fraction": 1.0, "memory_mb": 64}]},
            "memory_mb=64, which nothing uses",
        ),
        ({"clients.deadline_s": 3}, "clients.deadline_s=3 acts on simulated time"),
        ({"clients.over_select": 1.5}, "clients.over_select=1.5 acts on simulated time"),
        ({"clients.profiles": [ALL], "clients.deadline_s": 3}, "clients.min_replies is null"),
        ({"clients.profiles": [ALL], "measure.flops": False}, "measure.flops=false"),
        (
            {"clients.profiles": [{"device": "laptop", "fraction": 1.0}]},
            "'laptop' is not a named device",
        ),
    ],
)
def test_profile_fields_nothing_uses_are_refused_naming_them(tiny, overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(tiny(**overrides))


def test_an_enclave_size_is_refused_by_a_method_that_reads_none(tiny):
    cfg = load_config(
        tiny(**{"clients.profiles": [{"name": "tee", "fraction": 1.0, "enclave_mb": 8}]})
    )
    with pytest.raises(ConfigError, match=r"'tee' gives enclave_mb=8, which nothing.*'fedavg'"):
        build_run(cfg)


def test_over_selection_under_differential_privacy_is_refused(tiny):
    cfg = tiny(
        **{
            "clients.profiles": [ALL],
            "clients.over_select": 1.5,
            "clients.per_round": 2,
            "clients.min_replies": 1,
            "privacy": {"mechanism": "gaussian", "noise_multiplier": 1.0, "clip": 1.0},
        }
    )
    with pytest.raises(ConfigError, match="privacy accountant"):
        build_run(load_config(cfg))


def test_a_run_with_profiles_logs_simulated_time_summarises_and_plots_it(tiny, tmp_path):
    cfg = tiny(
        **{
            "rounds": 2,
            "clients.profiles": [MID, {**SLOW, "uplink_kbps": 100}],
            "clients.per_round": 2,
            "clients.over_select": 2.0,
            "clients.min_replies": 1,
            "clients.deadline_s": 30.0,
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fedge.run(cfg, out=tmp_path / "run", render=True)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(x["clients"] == 4 and len(x["sim_clients"]) == 4 for x in lines)  # 2 x 2 sampled
    for x in lines:  # the two kept are the two fastest; the round ends with the second
        kept = sorted(
            (sum(t[k] for k in ("down_s", "compute_s", "up_s")), int(c))
            for c, t in x["sim_clients"].items()
        )[:2]
        assert x["sim_time_s"] == pytest.approx(kept[-1][0])
        stragglers = {int(c) for c, t in x["sim_clients"].items() if t.get("straggler")}
        assert stragglers == {
            c
            for _, c in sorted(
                (sum(t[k] for k in ("down_s", "compute_s", "up_s")), int(c))
                for c, t in x["sim_clients"].items()
            )[2:]
        }
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["sim_time_total_s"] == pytest.approx(sum(x["sim_time_s"] for x in lines))
    assert (tmp_path / "run" / "plots" / "accuracy_vs_time.png").exists()
    assert "accuracy_vs_time.png" in (tmp_path / "run" / "report.md").read_text()


def test_a_straggler_under_secure_aggregation_is_recovered_as_a_dropout(tiny):
    """The slow device misses the deadline in the masked upload; the recovery exchange
    unmasks the sum of the three others, and the round completes under min_replies."""
    cfg = tiny(
        **{
            "rounds": 1,
            "clients.profiles": [MID, SLOW],
            "clients.min_replies": 2,
            "clients.deadline_s": 5.0,
            "method.secure_aggregation": True,
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = build_run(load_config(cfg)).simulation()
    line = sim.run_round(1)
    sim.close()
    slow = [int(c) for c, t in line["sim_clients"].items() if t.get("straggler")]
    assert len(slow) == 1 and line["clients_straggled"] == 1
    assert line["secagg_survivors"] == 3 and "round_skipped" not in line
    assert sorted(int(c) for c in sim.record.extra["first_aggregated"]) == sorted(
        set(range(4)) - set(slow)
    )


def test_deadline_on_a_flower_runtime_is_refused(tiny):
    pytest.importorskip("flwr")
    cfg = tiny(**{"clients.profiles": [ALL], "clients.min_replies": 2, "clients.deadline_s": 5.0})
    with pytest.raises(ConfigError, match="only the engine"):
        build_run(load_config(cfg)).simulation(runtime="flower-sim")
