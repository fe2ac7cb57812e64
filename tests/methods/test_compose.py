"""The composer: mechanisms applied once, in one order, by capability; impossible
combinations refused at validation with the capability's reason; no method wraps itself."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

import fedge
from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.experiment.build import build_run, method_config
from fedge.methods import METHODS, get_method
from fedge.methods.ema import EMAEvaluation
from fedge.methods.fedavg import DeltaAveraging
from fedge.methods.private import DifferentialPrivacy, PrivateClient
from fedge.methods.secure import SecureAggregation, SecureClient

#: what only the composer (and the mechanisms' own modules) may call
WRAPPERS = {
    "protect",
    "secure",
    "frozen_env",
    "evaluation",
    "EMAEvaluation",
    "DifferentialPrivacy",
    "PrivateClient",
    "SecureAggregation",
    "SecureClient",
    "compressed",
    "CompressingClient",
    "Decompression",
}
MECHANISM_MODULES = {"compose.py", "private.py", "secure.py", "ema.py", "compress.py"}


def _called(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            out.add(f.id if isinstance(f, ast.Name) else getattr(f, "attr", ""))
    return out


def test_no_method_module_wraps_its_own_sides():
    """Every module of a registered method (and every other module of fedge.methods but the
    mechanisms' own) calls none of the mechanisms' wrappers: only the composer applies them."""
    root = Path(fedge.__file__).parent / "methods"
    modules = {
        Path(importlib.import_module(s.build.__module__).__file__ or "") for s in METHODS.values()
    }
    assert modules
    bad = {
        str(p.relative_to(root)): sorted(_called(ast.parse(p.read_text())) & WRAPPERS)
        for p in root.rglob("*.py")
        if p.name not in MECHANISM_MODULES
    }
    assert not {k: v for k, v in bad.items() if v}


def test_the_scan_sees_a_wrapping_call():
    assert _called(ast.parse("x = protect(s, p, cfg)\ny = cfg.frozen_env(env)")) & WRAPPERS == {
        "protect",
        "frozen_env",
    }


def _built(tiny, privacy=None, **method):
    base = {"name": "fedavg", "local_epochs": 1, "batch_size": 16, "client_optimizer": {"lr": 0.1}}
    extra = {"privacy": privacy} if privacy else {}
    return build_run(load_config(tiny(method={**base, **method}, **extra)))


def test_the_order_is_freeze_dp_secure_aggregation_ema(tiny):
    dp = {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 0.5}
    with pytest.warns(Warning):
        built = _built(tiny, dp, secure_aggregation=True, ema=0.9, freeze=["features.fc1"])
    m = built.method
    assert m.applied == ("freeze", "dp", "secure_aggregation", "ema")
    s = m.strategy
    assert isinstance(s, EMAEvaluation)
    assert isinstance(s.inner, SecureAggregation)
    assert isinstance(s.inner.inner, DifferentialPrivacy)
    assert isinstance(s.inner.inner.inner, DeltaAveraging) and s.inner.inner.inner is m.bare
    assert isinstance(m.program, SecureClient) and isinstance(m.program.inner, PrivateClient)
    assert not _built(tiny).method.applied  # nothing asked, nothing applied


def test_freezing_composes_onto_fedavg(tiny):
    """method.freeze on FedAvg (freezable): the frozen tensors stay at their initial values and
    are not sent; the rest trains."""
    built = _built(tiny, freeze=["features.fc1"])
    before = {k: v.clone() for k, v in built.model_fn().state_dict().items()}
    sim = built.simulation()
    sim.run_round(1)
    after = sim.strategy.eval_model().state_dict()
    frozen = [k for k in before if k.startswith("features.fc1.")]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in before if k not in frozen)


@pytest.mark.parametrize(
    "key, value, reason",
    [
        ("secure_aggregation", True, "weighted sum of the clients' reply arrays"),
        ("secagg_dropout", 0.1, "weighted sum of the clients' reply arrays"),
        ("ema", 0.9, "no single global model"),
        ("freeze", ["fc1"], "parameters can be left frozen"),
    ],
)
def test_a_mechanism_the_method_cannot_take_is_refused_with_the_reason(tiny, key, value, reason):
    cfg = load_config(tiny(method={"name": "eppfl", key: value}))
    with pytest.raises(ConfigError, match=rf"method\.{key}: method 'eppfl' cannot take .*{reason}"):
        method_config(cfg)


def test_dp_on_a_method_that_does_not_sum_is_refused_before_any_data(tiny):
    cfg = load_config(
        tiny(
            method={"name": "eppfl"},
            privacy={"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0},
        )
    )
    with pytest.raises(
        ConfigError, match=r"privacy.mechanism=gaussian: method 'eppfl' cannot take"
    ):
        build_run(cfg)


def test_mechanism_options_are_declared_once_with_the_method_defaults():
    fedavg, baffle = get_method("fedavg").section, get_method("baffle").section
    assert fedavg.model_fields["ema"].default is None
    assert baffle.model_fields["ema"].default == 0.995  # BAFFLE's own default
    assert baffle().secure_aggregation is False and baffle(mode="batch").secure_aggregation is True
    # one declaration: the same field description, whichever method it is attached to
    for key in ("secure_aggregation", "ema", "freeze"):
        assert fedavg.model_fields[key].description == baffle.model_fields[key].description
    assert "secure_aggregation" not in get_method("baffle").config.model_fields
