"""Divergence is recognised by type (a DivergenceError raised while the rounds run), never by
the words of an error, and worded with the round, what diverged and the keys to lower."""

import math
import re

import pytest

from fedge.core.config import load_config
from fedge.core.errors import DivergenceError, MessageError
from fedge.experiment.divergence import over_limit
from fedge.experiment.progress import Progress
from fedge.experiment.run import run_experiment


class _RaisesAfter(Progress):
    """Raises ``exc`` once round ``rnd`` is written (inside the rounds, as the engine would)."""

    def __init__(self, rnd: int, exc: Exception) -> None:
        self.rnd, self.exc = rnd, exc

    def round(self, line, total_rounds):  # noqa: ANN001, ANN201
        if line["round"] == self.rnd:
            raise self.exc


def test_an_error_worded_like_a_divergence_but_not_one_passes_through_as_it_is(tmp_path, tiny):
    text = "round 1, client 0: array 'w' holds non-finite values (NaN or Inf); training diverged"
    with pytest.raises(MessageError) as info:
        run_experiment(
            load_config(tiny(rounds=2)),
            out=tmp_path / "run",
            progress=_RaisesAfter(1, MessageError(text)),
            render=False,
        )
    assert not isinstance(info.value, DivergenceError) and str(info.value) == text


def test_a_divergence_raised_in_the_rounds_is_worded_with_its_round_cause_and_keys(tmp_path, tiny):
    out = tmp_path / "run"
    raised = DivergenceError("the words of whoever raised it", round=2, cause="the sum blew up")
    with pytest.raises(DivergenceError) as info:
        run_experiment(
            load_config(tiny(rounds=3)),
            out=out,
            progress=_RaisesAfter(2, raised),
            render=False,
        )
    e = info.value
    assert e is not raised and (e.round, e.cause) == (2, "the sum blew up")
    assert str(e) == (
        "training diverged in round 2: the sum blew up; likely cause: a step size too large for "
        "this model: lower method.client_optimizer.lr (now 0.1) or method.server_optimizer.lr "
        f"(now 1.0). The run directory {str(out)!r} keeps rounds 1-2 and is not complete: start "
        "a new run, or edit its config.yaml and continue with "
        f"fedge run --resume {out} --allow-config-change"
    )  # no on_divergence: continue offered: there is no going on from it


def test_a_non_finite_reply_stops_the_run_naming_its_client(tmp_path, tiny):
    out = tmp_path / "run"
    with pytest.raises(DivergenceError) as info:
        run_experiment(
            load_config(tiny(rounds=2, **{"method.client_optimizer.lr": 1e6})),
            out=out,
            render=False,
        )
    e = info.value
    assert e.round == 1
    assert re.fullmatch(
        r"array '\S+' holds non-finite values \(NaN or Inf\) \(round 1, client \d\)", e.cause
    )
    assert str(e).startswith(f"training diverged in round 1: {e.cause}; likely cause: ")
    assert f"{str(out)!r} keeps no round and is not complete" in str(e)
    assert (out / "metrics.jsonl").read_text() == ""


def test_over_limit_names_the_first_loss_non_finite_or_above_the_limit():
    assert over_limit({"test_loss": 1.0, "train_loss": 5.0}, 2.0) == ("train_loss", 5.0)
    key, value = over_limit({"test_loss": math.nan, "train_loss": 5.0}, 2.0)
    assert key == "test_loss" and math.isnan(value)
    assert over_limit({"test_loss": 2.0, "train_loss": -math.inf}, 2.0) == (
        "train_loss",
        -math.inf,
    )
    assert over_limit({"test_loss": None, "train_loss": True}, 0.5) is None  # a bool is no loss
