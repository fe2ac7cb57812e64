"""EPPFL's aggregation server S_a (seed 003, Algorithm 1 lines 27-31, Eq. (9)-(10)): per round it
loads the global M_s into the sampled devices' edge servers, sends the devices the masked ring sum
of the last round's M_c uploads, drops the lost uploads, averages the edge servers' W_s with equal
weights (Eq. (10)), sums the masked uploads in Z_{2^64} (Eq. (9)) and tells S_r which devices it
aggregated; it also keeps the DP accounting (the worst device's releases). The round step by step:
``docs/methods/eppfl.md``, "The aggregation server's round".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.core.protocols import Exchange, PartyCall, Round, Strategy
from fedge.core.rng import generator
from fedge.methods.base import load_arrays, model_arrays
from fedge.methods.eppfl.device import float_keys, unflatten
from fedge.methods.eppfl.parties import MaskKeys
from fedge.methods.eppfl.split import Split
from fedge.privacy.dp.laplace import laplace_epsilon
from fedge.privacy.secagg import FixedPoint

__all__ = ["AggregationServer"]


class AggregationServer(Strategy):
    """S_a. ``oracle`` is the evaluation harness's copy of S_r's keys: used only by
    :meth:`eval_model` to read the global M_c for the test set (what any device can compute
    after step ⑨); nothing it computes travels or enters training."""

    def __init__(
        self,
        model: torch.nn.Module,
        split_fn: Callable[[], Split],
        cfg: Any,
        *,
        seed: int,
        num_clients: int,
        fp: FixedPoint,
        oracle: MaskKeys | None,
    ) -> None:
        self.model, self.cfg, self.seed, self.fp, self.oracle = model, cfg, seed, fp, oracle
        self.split = split_fn()
        arrays = model_arrays(model)
        self.edge_global = {k: arrays[k] for k in self.split.edge_keys}
        self.device_plain = {
            k: arrays[k] for k in self.split.device_keys
        }  # round 0 (public) or unmasked mode
        self.float_keys = float_keys(self.split)
        self.masked_sum: np.ndarray | None = None
        self.count = 0
        self.model_round = 0
        self.participation = torch.zeros(
            num_clients, dtype=torch.int64
        )  # rounds each device released in
        self._released: list[int] = []  # this round's devices that released (kept out of the state)
        self._agg_clients: list[int] | None = None  # the last completed round's aggregated devices

    @property
    def partial_replies(self) -> bool:
        """Yes: S_r's Σ r_j covers exactly the devices S_a aggregates, so a device whose reply
        is missing is simply not aggregated (as an ``upload_dropout`` one)."""
        return True

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        self._released = []
        for cid in client_ids:  # ⑦
            yield PartyCall("edge", Message(dict(self.edge_global), config={"op": "load"}), key=cid)
        config: dict[str, Any] = {
            "round": rnd,
            "model_round": self.model_round,
            "n_summands": len(client_ids),
        }
        if self.masked_sum is not None:
            config.update(masked_sum=self.fp.to_bytes(self.masked_sum), count=self.count)
            arrays = {k: v for k, v in self.device_plain.items() if k not in self.float_keys}
        else:
            arrays = dict(self.device_plain)
        broadcast = Message(arrays, config=config)
        self._released = list(client_ids)  # they release to their edge servers in this exchange
        self.participation[torch.tensor(self._released, dtype=torch.int64)] += 1
        replies = yield Exchange(dict.fromkeys(client_ids, broadcast))  # ⑥, then ②-④ on the devices

        dropped = self._dropouts(rnd, sorted(replies))
        agg = [c for c in sorted(replies) if c not in dropped]
        for cid in sorted(dropped | (set(client_ids) - set(replies))):
            yield PartyCall("edge", Message(config={"op": "discard"}), key=cid)
        if not agg:
            raise MessageError(f"round {rnd}: every upload was lost; lower method.upload_dropout")
        edge_sum: dict[str, torch.Tensor] = {}
        for cid in agg:  # ⑤, Eq. (10)
            got = yield PartyCall("edge", Message(config={"op": "upload"}), key=cid)
            if set(got.arrays) != set(self.edge_global):
                raise MessageError(
                    f"round {rnd}: edge server {cid} uploaded {sorted(got.arrays)[:4]}...; expected M_s"
                )
            for k, v in got.arrays.items():
                edge_sum[k] = (
                    edge_sum[k] + v.to(torch.float64) if k in edge_sum else v.to(torch.float64)
                )
        self.edge_global = {
            k: _mean(edge_sum[k], len(agg), self.edge_global[k].dtype) for k in self.edge_global
        }

        ints = [k for k in self.device_plain if k not in self.float_keys]
        if self.cfg.masks:  # Eq. (9) in Z_{2^64}: S_a holds Σ (q_i + r_i), never W_c
            uploads = []
            for cid in agg:
                blob = replies[cid].config.get("masked")
                if not isinstance(blob, bytes) or len(blob) != 8 * self._length():
                    raise MessageError(
                        f"round {rnd}, device {cid}: no masked M_c of {self._length()} ring elements"
                    )
                uploads.append(self.fp.from_bytes(blob))
            self.masked_sum, self.count, self._agg_ids = (
                self.fp.ring_sum(uploads),
                len(agg),
                list(agg),
            )
            yield PartyCall(
                "sr",
                Message(
                    {"ids": torch.tensor(agg, dtype=torch.int64)},
                    config={"op": "aggregate", "round": rnd},
                ),
            )
            keys = ints
        else:
            keys = list(self.device_plain)
        for k in keys:
            total = sum(replies[c].arrays[k].to(torch.float64) for c in agg)
            self.device_plain[k] = _mean(total, len(agg), self.device_plain[k].dtype)
        self.model_round = rnd
        self._agg_clients = list(agg)
        losses = [
            float(replies[c].metrics["train_loss"])
            for c in agg
            if "train_loss" in replies[c].metrics
        ]
        out: dict[str, float] = {
            "eppfl_aggregated": float(len(agg)),
            "eppfl_dropped": float(len(dropped)),
        }
        if losses:
            out["train_loss"] = sum(losses) / len(losses)
        return out

    def aggregated_clients(self) -> list[int] | None:
        """The devices aggregated last round (their replies arrived and their uploads were not
        lost, ``upload_dropout``): both halves of the split model, M_c and M_s, trained on their data."""
        return self._agg_clients

    def _length(self) -> int:
        return sum(self.device_plain[k].numel() for k in self.float_keys)

    def _dropouts(self, rnd: int, ids: list[int]) -> set[int]:
        count = int(self.cfg.upload_dropout * len(ids))
        if count == 0:
            return set()
        perm = torch.randperm(len(ids), generator=generator(self.seed, "eppfl-dropout", rnd))
        return {ids[i] for i in perm[:count].tolist()}

    def round_skipped(self, rnd: int) -> None:
        """The restore took back this round's participations; the devices addressed had already
        released their activations (the privacy is spent), so count them again."""
        if self._released:
            self.participation[torch.tensor(self._released, dtype=torch.int64)] += 1

    def round_metrics(self, line: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        edge = line.get("flops.edge")
        if edge is not None and line.get("client_flops"):
            out["device_flops_share"] = line["client_flops"] / (line["client_flops"] + edge)
        dp = self.cfg.dp
        if dp is not None and dp.sensitivity == "paper":  # no guarantee: no cumulative ε
            releases = int(self.participation.max()) * self.cfg.local_epochs
            out.update(dp_epsilon_step=dp.epsilon, dp_releases_max=releases)
        elif dp is not None:
            releases = int(self.participation.max()) * self.cfg.local_epochs
            eps = laplace_epsilon(float(dp.epsilon), releases, float(dp.delta))
            out.update(
                dp_epsilon_step=dp.epsilon,
                dp_releases_max=releases,
                dp_delta=dp.delta,
                dp_epsilon_pure=eps["pure"],
                dp_epsilon_rdp=eps["rdp"],
                dp_epsilon_pld=eps["pld"],
            )
        return out

    def global_device_model(self) -> dict[str, torch.Tensor]:
        """The global M_c in the clear (evaluation harness; see the class docstring)."""
        if self.masked_sum is None:
            return dict(self.device_plain)
        assert self.oracle is not None
        ids = self._last_ids()
        total = self.fp.sub(self.masked_sum, self.oracle.mask_sum(self.model_round, ids))
        out = dict(self.device_plain)
        out.update(
            unflatten(self.fp.decode(total) / self.count, self.device_plain, self.float_keys)
        )
        return out

    def _last_ids(self) -> list[int]:
        if self._agg_ids is None:
            raise MessageError("no aggregate to evaluate")
        return self._agg_ids

    def eval_model(self) -> torch.nn.Module:
        load_arrays(
            self.model, {**self.global_device_model(), **self.edge_global}, who="eppfl global model"
        )
        return self.model

    def state_dict(self) -> dict[str, Any]:
        s: dict[str, Any] = {
            "edge": dict(self.edge_global),
            "device": dict(self.device_plain),
            "model_round": self.model_round,
            "count": self.count,
            "participation": self.participation.clone(),
        }
        if self.masked_sum is not None:
            s["masked_sum"] = torch.from_numpy(self.masked_sum.view(np.int64).copy())
            s["agg_ids"] = torch.tensor(self._agg_ids or [], dtype=torch.int64)
        return s

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.edge_global, self.device_plain = dict(state["edge"]), dict(state["device"])
        self.model_round, self.count = int(state["model_round"]), int(state["count"])
        self.participation = state["participation"].clone()
        ms = state.get("masked_sum")
        self.masked_sum = None if ms is None else ms.numpy().view(np.uint64).copy()
        self._agg_ids = None if ms is None else [int(v) for v in state["agg_ids"].tolist()]

    _agg_ids: list[int] | None = None


def _mean(total: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    m = total / n
    return m.to(dtype) if dtype.is_floating_point else torch.round(m).to(dtype)
