"""The narrow strategy protocol: a small required core, optional hooks with defaults, and
wrappers that forward every hook they do not change."""

from __future__ import annotations

from typing import Any

import torch

from fedge.core.protocols import (
    OPTIONAL_HOOKS,
    ClientSelection,
    HasGlobalModel,
    PartialReplies,
    RoundAccounting,
    SideEvaluation,
    Stopping,
    Strategy,
    StrategyWrapper,
)


class _Inner(Strategy):
    """Every optional hook answers something no default does."""

    model = torch.nn.Linear(1, 1)

    @property
    def global_model(self) -> Any:
        return self

    @property
    def partial_replies(self) -> bool:
        return True

    def eligible(self, profile):
        return profile.get("ok", False)

    def eligible_client(self, cid, profile):
        return cid == 7

    def select_clients(self, rnd, num_clients, per_round):
        return [rnd]

    def stop_reason(self, rnd):
        return f"stop {rnd}"

    def round_metrics(self, line):
        return {"x": line["y"]}

    def round_skipped(self, rnd):
        self.skipped = rnd

    def aggregated_clients(self):
        return [1, 2]

    def side_eval_models(self):
        return {"raw": self.model}

    def eval_model(self):
        return self.model


def _answers(s: Strategy) -> dict[str, Any]:
    return {
        "global_model": s.global_model,
        "partial_replies": s.partial_replies,
        "eligible": s.eligible({"ok": True}),
        "eligible_client": (s.eligible_client(7, {}), s.eligible_client(3, {})),
        "select_clients": s.select_clients(4, 10, 2),
        "stop_reason": s.stop_reason(5),
        "round_metrics": s.round_metrics({"y": 1}),
        "aggregated_clients": s.aggregated_clients(),
        "side_eval_models": s.side_eval_models(),
        "eval_model": s.eval_model(),
    }


def test_a_wrapper_that_changes_nothing_answers_as_its_inner_strategy():
    inner = _Inner()
    wrapped = StrategyWrapper(StrategyWrapper(inner))
    assert _answers(wrapped) == _answers(inner)
    wrapped.round_skipped(9)
    assert inner.skipped == 9
    assert wrapped.state_dict() == {"inner": {"inner": {}}}


def test_a_wrapper_overrides_only_what_it_changes():
    class Stops(StrategyWrapper):
        def stop_reason(self, rnd):
            return "budget"

    inner = _Inner()
    got, want = _answers(Stops(inner)), _answers(inner)
    assert got.pop("stop_reason") == "budget" and want.pop("stop_reason") == "stop 5"
    assert got == want


def test_the_defaults_of_a_bare_strategy():
    s = Strategy()
    assert s.global_model is None and s.partial_replies is False
    assert s.eligible_client(0, {}) and s.select_clients(1, 4, 2) is None
    assert s.stop_reason(1) is None and s.round_metrics({}) == {}
    assert s.aggregated_clients() is None and s.side_eval_models() == {}
    assert s.profile_fields == frozenset()  # a profile field no part of a run reads is refused


def test_the_optional_hooks_are_small_protocols_and_wrappers_write_none_of_them():
    inner = _Inner()
    for proto in (
        ClientSelection,
        HasGlobalModel,
        PartialReplies,
        RoundAccounting,
        SideEvaluation,
        Stopping,
    ):
        assert isinstance(inner, proto)
    own = {k for k, v in vars(StrategyWrapper).items() if callable(v) or isinstance(v, property)}
    assert not own & set(OPTIONAL_HOOKS)
