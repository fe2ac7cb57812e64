"""PPFL: stages, enclave-memory selection, sealed uploads, no plaintext in the REE, zoo models."""

from __future__ import annotations

import gc
import types
import warnings
from functools import partial

import pytest
import torch
from safetensors.torch import save_file

from fedge.core.config import load_config
from fedge.core.errors import ConfigError, MessageError, ShortRoundError
from fedge.core.protocols import PartySpec
from fedge.experiment.build import build_run
from fedge.methods.ppfl.enclaves import ClientEnclave, EnclaveSpec, open_eval_blob
from fedge.privacy.tee import MiB
from tests.conftest import tiny_config
from tests_helpers import metrics_without_wall, record_replies, run_cut_after


def _cfg(**over):
    base = {
        "rounds": 3,
        "clients.num": 4,
        "clients.per_round": 4,
        "dataset.limit_train": 64,
        "dataset.limit_test": 40,
        "dataset.shape": [1, 16, 16],
        "model": {"name": "lenet-ppfl"},
        "method": {"name": "ppfl", "rounds_per_stage": 1, "batch_size": 8, "lr": 0.05},
    }
    base.update(over)
    return tiny_config(**base)


def _built(**over):
    return build_run(load_config(_cfg(**over)))


def _run(built, rounds):
    sim = built.simulation()
    try:
        return sim, [sim.run_round(r) for r in range(1, rounds + 1)]
    finally:
        sim.close()


def test_all_stages_run_and_log_stage_memory_and_eligibility():
    built = _built()
    sim, lines = _run(built, 3)
    assert [ln["stage"] for ln in lines] == [0, 1, 2]  # conv1, conv2, classifier
    for ln in lines:
        assert (
            ln["eligible_clients"] == 4
            and ln["trained_clients"] == 4
            and ln["rejected_clients"] == 0
        )
        # S_l at the full batch is exactly what the enclave held at its peak (first batch is full)
        assert (
            ln["tee_peak_bytes"] == ln["tee_need_bytes"] <= ln["tee_budget_min_bytes"] == 16 * MiB
        )
        assert (
            ln["bytes.client->tee"] > 0 and ln["bytes.server->server_tee"] > 0 and ln["seal_s"] > 0
        )
        # Table 4's client phases: opening the broadcast, training, sealing the upload; each
        # measured, disjoint, within the engine's wall time of the client programs (REE) and their enclaves
        phases = [ln["client_open_s"], ln["client_train_s"], ln["client_upload_s"]]
        assert all(p > 0 for p in phases) and sum(phases) <= ln["client_wall_s"] + ln["wall_s.tee"]
        assert (
            ln["client_upload_s"] >= ln["seal_s"]
        )  # the upload call seals (and packs) the stage model
    # the REE got every layer when its stage ended, but the classifier stays in the enclaves
    assert set(sim.strategy.released) == {
        k for k in built.model_fn().state_dict() if not k.startswith("classifier.")
    }


def _needs(built):
    s = built.method.strategy
    return [n(8) for n in s.need]


def test_client_with_small_enclave_excluded_from_a_stage_only():
    needs = _needs(_built())
    assert (
        needs[0] > needs[2]
    )  # conv1's head (800→500 FC atop a 1x1 conv) needs more than the classifier
    small_mb = (needs[2] + needs[0]) / 2 / MiB  # fits the classifier stage, not stage 0
    prof = [
        {"name": "big", "fraction": 0.5, "enclave_mb": 16},
        {"name": "small", "fraction": 0.5, "enclave_mb": small_mb},
    ]
    built = _built(**{"clients.profiles": prof, "method.rounds_per_stage": 1})
    sim, lines = _run(built, 3)
    small = {c for c, p in enumerate(sim.profiles) if p["name"] == "small"}
    assert lines[0]["eligible_clients"] == 2 and lines[0]["trained_clients"] == 2
    assert lines[2]["eligible_clients"] == 4 and lines[2]["trained_clients"] == 4
    assert lines[0]["tee_peak_bytes"] <= 16 * MiB
    assert small and all(
        sim.strategy.client_has.get(c, 0) == 2 for c in small
    )  # first trained in stage 2


def test_a_stage_fewer_enclaves_fit_than_min_cohort_fails_before_training():
    """One client of four fits stage 0: under the default min_cohort 2 no stage-0 round could
    ever be averaged, so the build refuses the config, naming the stage, the profiles and the fixes."""
    needs = _needs(_built())
    small_mb = (needs[2] + needs[0]) / 2 / MiB  # fits the classifier stage, not stage 0
    prof = [
        {"name": "big", "fraction": 0.25, "enclave_mb": 16},
        {"name": "small", "fraction": 0.75, "enclave_mb": small_mb},
    ]
    with pytest.raises(
        ConfigError,
        match=rf"stage 0 .* needs S_l = {needs[0] / MiB:.2f} MiB .*only the 1 client\(s\) of 'big' have "
        rf"it, fewer than method.min_cohort=2 .*'small' \(enclave_mb={small_mb:g}\) too small.*"
        r"method.min_batch_size.*lower method.min_cohort",
    ):
        _built(**{"clients.profiles": prof})
    _built(**{"clients.profiles": prof, "method.min_cohort": 1}).simulation().run_round(
        1
    )  # one suffices then


def test_enclave_sizes_are_recorded_by_client_id_in_any_offer_order():
    s = _built(**{"method.min_batch_size": 1}).method.strategy
    sizes = {3: 16.0, 0: 2.0, 2: 8.0, 1: 4.0}  # offered out of client order
    for cid, mb in sizes.items():
        s.eligible_client(cid, {"enclave_mb": mb})
    assert s.budgets == {c: int(mb * MiB) for c, mb in sizes.items()}
    assert s._checked  # every client's enclave known: the no-fit check ran (and passed)
    assert s.eligible({"enclave_mb": 16.0}) and not s.eligible({"enclave_mb": 0.01})


def test_batch_shrinks_to_fit():
    needs = _needs(_built())
    s = _built(**{"method.min_batch_size": 2}).method.strategy
    budget = (s.need[0](4) + s.need[0](5)) // 2
    assert (
        s.batch_for(budget, 0) == 4
        and s.batch_for(needs[0], 0) == 8
        and s.batch_for(s.need[0](2) - 1, 0) is None
    )


def test_no_client_fits_fails_before_training():
    with pytest.raises(
        ConfigError, match=r"stage 0 .* needs S_l = .* largest client enclave is 0.50 MiB"
    ):
        _built(**{"method.tee": {"client_mb": 0.5}})
    # with profiles: a stage no profile fits is refused at the build, naming the profile
    prof = [{"name": "a", "fraction": 1.0, "enclave_mb": 0.3}]
    with pytest.raises(
        ConfigError,
        match=r"stage 0 .* needs S_l = [0-9.]+ MiB of enclave memory at batch 8, more than any client's "
        r"enclave: clients.profiles 'a' \(enclave_mb=0.3\); set enclave_mb to at least [0-9.]+ in "
        r"clients.profiles",
    ):
        _built(**{"clients.profiles": prof})


class _Spy:
    """Records what each client enclave trained (reads the enclave's memory: a test only)."""

    def __init__(self, monkeypatch):
        self.trained: dict[int, dict[str, torch.Tensor]] = {}
        orig = ClientEnclave.handle

        def handle(this, msg, ctx):
            if msg.config.get("op") == "end":
                self.trained[ctx.key] = {
                    k: v.detach().clone() for k, v in this._live.net.state_dict().items()
                }
                self.samples = getattr(self, "samples", {})
                self.samples[ctx.key] = this._live.samples
            return orig(this, msg, ctx)

        monkeypatch.setattr(ClientEnclave, "handle", handle)


class _Tamper:
    def __init__(self, inner, victim):
        self.inner, self.victim = inner, victim

    def run(self, message, ctx):
        reply = self.inner.run(message, ctx)
        if ctx.cid == self.victim and "upload" in reply.config:
            b = bytearray(reply.config["upload"])
            b[len(b) // 2] ^= 0x01  # one byte of the ciphertext
            reply.config["upload"] = bytes(b)
        return reply


def test_tampered_upload_is_rejected_and_the_rest_averaged(monkeypatch):
    spy = _Spy(monkeypatch)
    built = _built()
    built.method.program = _Tamper(built.method.program, victim=2)
    sim, lines = _run(built, 1)
    assert lines[0]["rejected_clients"] == 1 and lines[0]["trained_clients"] == 3
    assert sim.strategy.aggregated_clients() == [0, 1, 3]  # the rejected upload is not in the model
    got = open_eval_blob(sim.strategy.eval_blob)
    ok = [c for c in spy.trained if c != 2]
    n = {c: spy.samples[c] for c in ok}
    for k, v in got.items():
        if v.is_floating_point():
            want = sum(n[c] * spy.trained[c][k] for c in ok) / sum(n.values())
            torch.testing.assert_close(v, want, rtol=1e-5, atol=1e-6)


def test_tampered_upload_aborts_when_configured():
    built = _built(**{"method.on_bad_upload": "abort"})
    built.method.program = _Tamper(built.method.program, victim=1)
    sim = built.simulation()
    with pytest.raises(MessageError, match=r"rejected the sealed uploads of clients \[1\]"):
        sim.run_round(1)


def _reachable(root):
    seen, out, stack = set(), [], [root]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(
            o, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)
        ):
            continue
        seen.add(id(o))
        out.append(o)
        if isinstance(o, EnclaveSpec):  # the enclave code and its *initial* weights
            continue
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        else:
            if hasattr(o, "__dict__"):
                stack.append(vars(o))
            stack.extend(gc.get_referents(o))
    return out


def test_ree_objects_hold_no_plaintext_of_the_trained_layer_or_head(monkeypatch):
    spy = _Spy(monkeypatch)
    built = _built(**{"method.rounds_per_stage": 5, "rounds": 5})
    sim, _ = _run(built, 2)  # mid-stage: nothing released yet
    secrets = [open_eval_blob(sim.strategy.eval_blob)] + list(spy.trained.values())
    probes = [
        v.flatten()[:16].numpy().tobytes()
        for s in secrets
        for v in s.values()
        if v.is_floating_point() and v.numel() >= 16
    ]
    tensors = [v for s in secrets for v in s.values() if v.is_floating_point()]
    objs = _reachable(sim) + _reachable(built.method.program)
    nbytes = ntens = 0
    for o in objs:
        if isinstance(o, (bytes, bytearray)):
            nbytes += 1
            assert not any(p in o for p in probes)
        elif isinstance(o, torch.Tensor) and o.is_floating_point():
            ntens += 1
            assert not any(o.shape == t.shape and torch.equal(o, t) for t in tensors)
    walked = {id(o) for o in objs}
    stored = [sim.strategy.eval_blob] + [b for v in sim.party_states.values() for b in v.values()]
    assert len(stored) == 6 and all(id(b) in walked for b in stored)  # the sealed blobs were walked
    assert ntens > 0
    # the probes do find plaintext where it is: in the unsealed state
    from fedge.methods.ppfl.enclaves import _pack

    assert all(any(p in _pack(s) for s in secrets) for p in probes)


@pytest.mark.parametrize(
    "model", [{"name": "lenet-ppfl"}, {"name": "alexnet-ppfl"}, {"name": "vgg9", "dropout": False}]
)
def test_zoo_models_train_one_round_of_one_stage(model):
    built = _built(
        **{
            "model": model,
            "clients.num": 2,
            "clients.per_round": 2,
            "dataset.limit_train": 16,
            "method.batch_size": 4,
            "method.tee": {"client_mb": 64},
        }
    )
    sim, lines = _run(built, 1)
    assert lines[0]["stage"] == 0 and lines[0]["trained_clients"] == 2
    assert 0 < lines[0]["tee_peak_bytes"] <= 64 * MiB and lines[0]["test_accuracy"] is not None


def test_dropout_in_the_client_enclave_draws_from_its_own_stream(monkeypatch):
    """A stage with dropout (vgg9, ``block_layers: 4``: conv1-conv4, D0.05 among them) trains
    the same in a client enclave whatever ran before it in the process — torch's global RNG
    used in between, or another client's step first — since its masks come from a stream
    seeded from the enclave's own generator (as local training's, ``tests/methods/test_local.py``).
    Oracle: each client's trained stage model (layer and head) at ``end``, before sealing."""
    trained: dict[int, dict[str, torch.Tensor]] = {}
    handle = ClientEnclave.handle

    def keep(self, msg, ctx):
        if msg.config.get("op") == "end":
            trained[ctx.key] = {k: v.clone() for k, v in self._live.net.state_dict().items()}
        return handle(self, msg, ctx)

    monkeypatch.setattr(ClientEnclave, "handle", keep)
    over = {
        "model": {"name": "vgg9"},
        "method.block_layers": 4,
        "clients.num": 3,
        "clients.per_round": 3,
        "dataset.limit_train": 24,
        "method.batch_size": 4,
        "method.tee": {"client_mb": 64},
    }

    def round_one(sample, burn=False):
        built = _built(**over)
        assert any(
            isinstance(m, torch.nn.Dropout) for m in built.method.strategy.spec.net(0).modules()
        )
        sim = built.simulation()
        sim.sample = lambda rnd: sample
        trained.clear()
        try:
            if burn:
                torch.rand(1000)  # someone else used the global RNG in this process
            return sim.run_round(1)["test_loss"], dict(trained)
        finally:
            sim.close()

    def same(a, b):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    loss, base = round_one([0, 1, 2])
    burned_loss, burned = round_one([0, 1, 2], burn=True)
    assert burned_loss == loss and all(same(burned[c], base[c]) for c in (0, 1, 2))
    _, alone = round_one([1, 2])  # client 1 first now: no client 0 drew dropout masks before it
    assert all(same(alone[c], base[c]) for c in (1, 2))


def test_block_layers_two_trains_both_convs_in_one_stage():
    built = _built(**{"method.block_layers": 2})
    s = built.method.strategy
    assert [st.prefixes for st in s.stages] == [
        ("features.conv1", "features.conv2"),
        ("classifier",),
    ]
    sim, lines = _run(built, 2)
    assert [ln["stage"] for ln in lines] == [0, 1]


class _Rogue(EnclaveSpec):
    """An enclave running other code: its client measurement differs."""

    def measurement(self, role):
        return super().measurement(role) if role == "server" else b"x" * 32


def test_refused_attestation_excludes_the_client():
    built = _built()
    spec = built.method.strategy.spec
    other = _Rogue(
        spec.model_fn, spec.stages, spec.seed, spec.init_arrays, spec.config, spec.server_mb
    )
    built.method.parties["tee"] = PartySpec("tee", partial(ClientEnclave, other), scope="client")
    sim = built.simulation()
    with pytest.raises(
        ShortRoundError, match="0 of the sampled clients are attested"
    ):  # no cohort left to train
        sim.run_round(1)
    sim.close()
    assert sim.strategy.refused == {0, 1, 2, 3} and not sim.strategy.attested


def test_transfer_freezes_layers_from_a_pretrained_file(tmp_path):
    pre = _built().model_fn()
    with torch.no_grad():
        pre.features.conv1.conv.weight.fill_(0.01)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in pre.state_dict().items()}, str(path))
    built = _built(**{"method.init_from": str(tmp_path), "method.freeze_from_init": 1})
    sim, lines = _run(built, 2)
    assert [ln["stage"] for ln in lines] == [1, 2]
    assert torch.equal(
        sim.strategy.released["features.conv1.conv.weight"], pre.features.conv1.conv.weight
    )
    with pytest.raises(ConfigError, match="no such file"):
        _built(**{"method.init_from": str(tmp_path / "nope")})


def test_enclave_refuses_a_batch_over_its_budget(monkeypatch):
    from fedge.methods.ppfl import PpflClient
    from fedge.privacy.tee import EnclaveMemoryError

    need8 = _needs(_built())[0]
    built = _built(**{"method.tee": {"client_mb": (need8 + 1) / MiB}})
    orig = PpflClient.run

    def run(self, message, ctx):  # an REE that ignores the batch size it was given
        if message.config.get("op") == "train":
            message.config["batch_size"] = 16
        return orig(self, message, ctx)

    monkeypatch.setattr(PpflClient, "run", run)
    sim = built.simulation()
    with pytest.raises(EnclaveMemoryError, match="over the enclave's budget"):
        sim.run_round(1)


def test_finished_run_released_in_full_saves_the_model_usable_as_init_from(tmp_path):
    from safetensors.torch import load_file

    from fedge.core.errors import PrivacyWarning
    from fedge.experiment.run import run_experiment

    with pytest.warns(PrivacyWarning, match="keep_last_in_tee=false.*membership inference"):
        run_experiment(
            load_config(_cfg(**{"method.keep_last_in_tee": False})),
            out=tmp_path / "r",
            render=False,
        )
    saved = load_file(str(tmp_path / "r" / "model.safetensors"))
    model = _built().model_fn()
    assert set(saved) == set(model.state_dict())
    built = _built(**{"method.init_from": str(tmp_path / "r"), "method.freeze_from_init": 2})
    assert built.method.strategy.stage == 2
    assert torch.equal(
        built.method.strategy.released["features.conv2.conv.weight"],
        saved["features.conv2.conv.weight"],
    )


def test_last_stage_stays_in_the_enclaves_by_default(tmp_path):
    """PPFL Sec. 3: the classifier is never released. The REE and model.safetensors get the
    conv layers only; the final evaluation (an ECALL) equals the released run's, whose training
    is the same; the completed model cannot be loaded or exported, but a run can be attacked
    (the attacker's own classifier atop the released layers) and extended."""
    from safetensors.torch import load_file

    from fedge.experiment.export import WithheldModelError, export_model, load_trained_model
    from fedge.experiment.resume import resume_experiment
    from fedge.experiment.run import run_experiment

    kept = run_experiment(load_config(_cfg()), out=tmp_path / "kept", render=False)
    with pytest.warns(UserWarning):
        full = run_experiment(
            load_config(_cfg(**{"method.keep_last_in_tee": False})),
            out=tmp_path / "full",
            render=False,
        )
    model = _built().model_fn().state_dict()
    classifier = sorted(k for k in model if k.startswith("classifier."))
    saved = load_file(str(kept / "model.safetensors"))
    assert classifier and set(saved) == set(model) - set(classifier)
    full_saved = load_file(str(full / "model.safetensors"))
    assert all(torch.equal(saved[k], full_saved[k]) for k in saved)
    a, b = _deterministic(kept), _deterministic(full)
    assert [x["test_accuracy"] for x in a] == [x["test_accuracy"] for x in b]
    assert (
        a[-1]["tee_kept_params"] == sum(model[k].numel() for k in classifier)
        and "tee_kept_params" not in b[-1]
    )
    with pytest.raises(
        WithheldModelError,
        match=r"kept its last stage \(classifier\..*\) inside the enclaves.*keep_last_in_tee=false",
    ):
        export_model(kept)
    with pytest.raises(WithheldModelError):
        load_trained_model(kept)
    trained = load_trained_model(kept, withheld_ok=True)
    assert trained.withheld == tuple(classifier)
    assert torch.equal(
        trained.model.state_dict()[classifier[0]], model[classifier[0]]
    )  # the initial value, not the trained
    resume_experiment(
        kept, rounds=4, render=False
    )  # the enclaves still hold the last stage: it trains on
    assert len(_deterministic(kept)) == 4 and _deterministic(kept)[-1]["stage"] == 2


class _Record:
    """Records every sealed message that crosses the REE (broadcasts in, uploads out)."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def run(self, message, ctx):
        if "blob" in message.config:
            self.seen.append((ctx.cid, message.config["blob"]))
        reply = self.inner.run(message, ctx)
        if "upload" in reply.config:
            self.seen.append((ctx.cid, reply.config["upload"]))
        return reply


def test_no_nonce_repeats_under_a_session_key_in_a_run():
    built = _built(**{"clients.per_round": 2, "rounds": 6, "method.rounds_per_stage": 2})
    rec = built.method.program = _Record(built.method.program)
    _run(built, 6)
    nonces = [(cid, blob[:12]) for cid, blob in rec.seen]  # one session key per client
    assert len(nonces) == 6 * 2 * 2 and len(set(nonces)) == len(nonces)


# -- resuming --------------------------------------------------------------------------------

_RESUME = {"rounds": 5, "method.rounds_per_stage": 2, "clients.per_round": 3, "eval_every": 1}


def _deterministic(run_dir):
    """metrics.jsonl without any timing (``*_s``, ``wall_s.*``)."""
    return [
        {k: v for k, v in ln.items() if not (k.endswith("_s") or "wall_s" in k)}
        for ln in metrics_without_wall(run_dir)
    ]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    from fedge.experiment.run import run_experiment

    return run_experiment(
        load_config(_cfg(**_RESUME)), out=tmp_path_factory.mktemp("ppfl") / "full", render=False
    )


@pytest.mark.parametrize(
    "cut,process", [(2, "this"), (3, "new")]
)  # 2: a stage just ended, its release due; 3: mid-stage
def test_interrupted_run_resumes_to_the_uninterrupted_metrics(
    tmp_path, monkeypatch, uninterrupted, cut, process
):
    """The enclaves' sealed state (stage model, session keys, channel counters) is in the
    checkpoint and opens again in a later process on the same platform; every draw derives
    from the seed, so the resumed run is the uninterrupted one (timings aside)."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    from fedge.experiment.resume import resume_experiment

    run_cut_after(_cfg(**_RESUME), tmp_path / "cut", cut, monkeypatch)
    assert len(_deterministic(tmp_path / "cut")) == cut
    if process == "new":
        done = subprocess.run(
            [sys.executable, "-m", "fedge", "run", "--resume", str(tmp_path / "cut")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    else:
        resume_experiment(tmp_path / "cut", render=False)
    assert _deterministic(tmp_path / "cut") == _deterministic(uninterrupted)
    assert [ln["stage"] for ln in _deterministic(uninterrupted)] == [0, 0, 1, 1, 2]
    a, b = (
        load_file(str(tmp_path / "cut" / "model.safetensors")),
        load_file(str(uninterrupted / "model.safetensors")),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _tree(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_resume_on_another_platform_is_refused_by_name_and_changes_nothing(tmp_path, monkeypatch):
    from fedge.core.errors import ResumeError
    from fedge.experiment.resume import resume_experiment
    from fedge.privacy.tee import platform_id

    run_cut_after(_cfg(**_RESUME), tmp_path / "cut", 3, monkeypatch)
    before, here = _tree(tmp_path / "cut"), platform_id()
    monkeypatch.setenv("FEDGE_TEE_PLATFORM", str(tmp_path / "other-machine"))
    assert platform_id() != here  # a fresh platform: other fuses
    with pytest.raises(ResumeError, match=f"sealed on TEE platform {here}.*Resume it where it ran"):
        resume_experiment(tmp_path / "cut", render=False)
    assert _tree(tmp_path / "cut") == before


def test_finished_run_cannot_be_extended_and_is_left_as_it_was(tmp_path):
    from fedge.core.errors import ResumeError
    from fedge.experiment.resume import resume_experiment
    from fedge.experiment.run import run_experiment

    out = run_experiment(load_config(_cfg(rounds=2)), out=tmp_path / "r", render=False)
    before = _tree(out)
    with pytest.raises(
        ResumeError, match="this ppfl run cannot be extended.*released stage 1.*rounds=4"
    ):
        resume_experiment(out, rounds=4, render=False)
    assert _tree(out) == before


def test_clients_that_fail_are_left_out_of_attestation_and_aggregation():
    """clients.dropout loses clients at the attestation exchange and at the training exchange;
    each round's enclave-evaluated model is that of a run whose rounds sample only the clients
    that delivered their training reply (the oracle), and a client lost at attestation attests
    when next sampled."""
    # min_cohort 1: this seed leaves one client in a round, and the oracle must average it too
    over = {"clients.dropout": 0.25, "clients.min_replies": 1, "seed": 5, "method.min_cohort": 1}
    sim = _built(**over).simulation()
    got = record_replies(sim)
    lines = [sim.run_round(r) for r in (1, 2, 3)]
    sim.close()
    last = {r: got[(r, max(p for q, p in got if q == r))] for r in (1, 2, 3)}
    lost_at_attest = set(range(4)) - set(got[(1, 0)])
    assert lost_at_attest and any(
        set(got[(1, 0)]) - set(last[1]) or len(last[r]) < 4 for r in (2, 3)
    )
    assert sum(x["clients_failed"] for x in lines) > len(lost_at_attest)
    oracle = _built(**{**over, "clients.dropout": 0.0, "clients.min_replies": None}).simulation()
    oracle.sample = lambda rnd: last[rnd]
    expected = [oracle.run_round(r) for r in (1, 2, 3)]
    oracle.close()
    assert [(x["test_accuracy"], x["test_loss"]) for x in lines] == [
        (x["test_accuracy"], x["test_loss"]) for x in expected
    ]
    assert [x["trained_clients"] for x in lines] == [len(last[r]) for r in (1, 2, 3)]
    assert sim.strategy.attested == {c for r in (1, 2, 3) for c in last[r]} | set(got[(1, 0)])


# -- what the enclaves let the REEs do ---------------------------------------------------------


class _Enclaves:
    """The two enclaves driven directly, as an REE may drive them (any op, any order): a
    server enclave, and a client enclave per client, each with the sealed state the REE keeps."""

    def __init__(self, built, cids=(0, 1)):
        from fedge.methods.ppfl.enclaves import ServerEnclave

        self.spec = built.method.strategy.spec
        self.server = ServerEnclave(self.spec)
        # an REE may still name lr and momentum in begin: the measured values are accepted
        self.measured = {"lr": self.spec.config["lr"], "momentum": self.spec.config["momentum"]}
        self.states: dict[int | None, dict] = {None: {}, **{c: {} for c in cids}}
        hello = self.server_call(op="hello", ids=_ids(cids))
        reg = {"op": "register", "ids": _ids(cids)}
        for c in cids:
            rep = self.client_call(
                c,
                op="attest",
                challenge=hello.config[f"challenge/{c}"],
                **{
                    k: hello.config[k]
                    for k in ("server_measurement", "server_pk", "server_signature")
                },
            )
            reg.update({f"{k}/{c}": rep.config[k] for k in ("measurement", "pk", "signature")})
        assert self.server_call(**reg).config["refused"] == ""

    def _ctx(self, key):
        from fedge.core.context import PartyContext
        from fedge.core.meter import Meter

        return PartyContext(
            "tee" if key is not None else "server_tee",
            key,
            1,
            self.states[key],
            torch.Generator(),
            Meter(),
        )

    def server_call(self, arrays=None, **config):
        from fedge.core.messages import Message
        from fedge.methods.ppfl.enclaves import ServerEnclave

        return ServerEnclave(self.spec).handle(Message(arrays or {}, config), self._ctx(None))

    def client_call(self, cid, arrays=None, enclave=None, **config):
        from fedge.core.messages import Message

        return (enclave or ClientEnclave(self.spec)).handle(
            Message(arrays or {}, config), self._ctx(cid)
        )

    def batch(self, n):
        st = self.spec.stages[0]
        g = torch.Generator().manual_seed(n)
        return {
            "x": torch.randn(n, *st.in_shape, generator=g),
            "y": torch.randint(0, 10, (n,), generator=g),
        }

    def train(self, cid, blob, *, batches, rnd=1):
        """begin, a batch of each size in ``batches``, end, on one enclave object (one client
        step): the replies to the batches and to end."""
        enc = ClientEnclave(self.spec)
        self.client_call(
            cid,
            enclave=enc,
            op="begin",
            blob=blob,
            rnd=rnd,
            stage=0,
            budget=16 * MiB,
            **self.measured,
        )
        replies = [self.client_call(cid, self.batch(n), enclave=enc, op="batch") for n in batches]
        return replies, self.client_call(cid, enclave=enc, op="end")


def _ids(cids):
    return ",".join(map(str, cids))


def test_a_replayed_broadcast_is_refused_by_the_client_enclave():
    """The REE cannot open one stage model in its enclave again and again: the broadcast's
    counter is spent when ``begin`` opens it, not only at ``end``."""
    from fedge.privacy.tee import SealError

    e = _Enclaves(_built())
    blob = e.server_call(op="broadcast", stage=0, rnd=1, ids="0,1").config["c/0"]
    begin = {"op": "begin", "blob": blob, "rnd": 1, "stage": 0, "budget": 16 * MiB, **e.measured}
    e.client_call(0, **begin)  # opened; this client step then never reaches end
    with pytest.raises(SealError, match="replayed or reordered"):
        e.client_call(0, **begin)


def test_client_enclave_lets_out_no_loss_and_trains_at_the_measured_lr():
    """No per-batch loss leaves the enclave (it was an oracle on the hidden model: −log p_y per
    query); ``end`` lets out its memory peak and sealing time, the sample count and mean loss
    travel sealed. The step is SGD at the measured lr and momentum (oracle: torch's SGD on the
    broadcast model); a begin asking for another lr, momentum or budget is refused."""
    e = _Enclaves(_built())
    spec = e.spec
    bc = e.server_call(op="broadcast", stage=0, rnd=1, ids="0,1")
    enc = ClientEnclave(spec)
    e.client_call(
        0,
        enclave=enc,
        op="begin",
        blob=bc.config["c/0"],
        rnd=1,
        stage=0,
        budget=16 * MiB,
        **e.measured,
    )
    xy = e.batch(8)
    reply = e.client_call(0, xy, enclave=enc, op="batch")
    assert not reply.arrays and not reply.config and not reply.metrics
    net = spec.net(0)  # what the server enclave broadcast: the stage's initial model
    opt = torch.optim.SGD(net.parameters(), lr=spec.config["lr"], momentum=spec.config["momentum"])
    torch.nn.functional.cross_entropy(net(xy["x"]), xy["y"]).backward()
    opt.step()
    got = enc._live.net.state_dict()
    assert all(torch.equal(got[k], v) for k, v in net.state_dict().items())
    end = e.client_call(0, enclave=enc, op="end")
    assert set(end.metrics) == {"peak", "seal_s"} and set(end.config) == {"upload"}

    def begin(rnd, **over):
        blob = e.server_call(op="broadcast", stage=0, rnd=rnd, ids="1").config["c/1"]
        return e.client_call(
            1, op="begin", blob=blob, rnd=rnd, stage=0, **{"budget": 16 * MiB, **e.measured, **over}
        )

    for rnd, (k, v) in enumerate(
        (("lr", 0.0), ("momentum", 0.0)), start=2
    ):  # lr = 0: the loss-oracle query
        with pytest.raises(MessageError, match=f"{k}={v}.*the attested configuration says"):
            begin(rnd, **{k: v})
    begin(4)  # the measured values are fine; this first begin fixes the enclave's size
    with pytest.raises(MessageError, match=f"budget of {64 * MiB} bytes.*created with {16 * MiB}"):
        begin(5, budget=64 * MiB)


def test_server_enclave_weights_by_sealed_counts_and_refuses_a_lone_upload():
    """The REE's sample counts are not used (the oracle: the mean weighted by what each client
    enclave trained on); one upload alone is not averaged, and the stage's layers are not
    released before a cohort of method.min_cohort=2 was."""
    spy_trained = {}
    e = _Enclaves(_built(), cids=(0, 1, 2))
    bc = e.server_call(op="broadcast", stage=0, rnd=1, ids="0,1,2")
    uploads = {}
    for c, batches in ((0, [8]), (1, [8, 8, 8]), (2, [4])):
        enc = ClientEnclave(e.spec)
        e.client_call(
            c,
            enclave=enc,
            op="begin",
            blob=bc.config[f"c/{c}"],
            rnd=1,
            stage=0,
            budget=16 * MiB,
            **e.measured,
        )
        for n in batches:
            e.client_call(c, e.batch(n), enclave=enc, op="batch")
        spy_trained[c] = {k: v.clone() for k, v in enc._live.net.state_dict().items()}
        uploads[c] = e.client_call(c, enclave=enc, op="end").config["upload"]
    lone = e.server_call(
        op="aggregate", stage=0, rnd=1, ids="2", **{"u/2": uploads[2], "n/2": 1000}
    )
    assert "eval" not in lone.config and "fewer than method.min_cohort=2" in lone.config["short"]
    with pytest.raises(MessageError, match="has not aggregated a cohort"):
        e.server_call(op="release", stage=0)
    out = e.server_call(
        op="aggregate",
        stage=0,
        rnd=1,
        ids="0,1",
        **{"u/0": uploads[0], "u/1": uploads[1], "n/0": 1000, "n/1": 1},
    )
    got = open_eval_blob(out.config["eval"])
    for k, v in got.items():
        if v.is_floating_point():
            torch.testing.assert_close(
                v, (8 * spy_trained[0][k] + 24 * spy_trained[1][k]) / 32, rtol=1e-5, atol=1e-6
            )
    assert set(e.server_call(op="release", stage=0).arrays) == set(e.spec.to_model_keys(0, got))


def test_a_client_report_over_no_pending_challenge_is_refused():
    """A report answers the challenge ``hello`` drew for that client, once: a report over no
    challenge (no hello for it, or its challenge already used) registers nothing."""
    from fedge.privacy.secagg.keys import KeyPair
    from fedge.privacy.tee import sign_report

    e = _Enclaves(_built(), cids=(0,))
    e.states[1] = {}
    report = sign_report(e.spec.measurement("client"), KeyPair.generate().public, b"")
    reg = {
        "op": "register",
        "ids": "1",
        "measurement/1": report.measurement,
        "pk/1": report.public_key,
        "signature/1": report.signature,
    }
    assert e.server_call(**reg).config["refused"] == "1"
    with pytest.raises(MessageError, match="client 1 has no attested session"):
        e.server_call(op="broadcast", stage=0, rnd=1, ids="1")


def test_a_round_skipped_right_after_a_stage_ends_keeps_the_released_layers():
    """Round 2 opens stage 1: the server enclave releases stage 0 and broadcasts stage 1, then
    the training exchange falls short of clients.min_replies (seed 47 drops clients 0 and 2 in
    it, and no one else in rounds 1-3) and the round is skipped: the strategy's state is put
    back, the enclave's is not. Round 3 asks for stage 0 again and gets the same layers; the
    run ends as one whose round 2 did nothing (the oracle: a round 2 skipped before any call)."""
    over = {
        "clients.dropout": 0.2,
        "clients.min_replies": 3,
        "seed": 47,
        "method.rounds_per_stage": 1,
    }
    sim, lines = _run(_built(**over), 3)
    assert [ln.get("round_skipped", 0) for ln in lines] == [0, 1, 0] and lines[1][
        "clients_failed"
    ] == 2
    assert "clients.min_replies=3" in sim.record.extra["skipped_rounds"]["2"]
    oracle = _built(**over).simulation()
    real_round = oracle.strategy.round

    def round_(rnd, ids):
        if rnd != 2:
            return real_round(rnd, ids)

        def nothing():
            raise ShortRoundError("round 2 does nothing")
            yield

        return nothing()

    oracle.strategy.round = round_
    expected = [oracle.run_round(r) for r in (1, 2, 3)]
    oracle.close()
    assert [ln.get("round_skipped", 0) for ln in expected] == [0, 1, 0] and expected[2][
        "stage"
    ] == 1
    pick = ("stage", "trained_clients", "test_accuracy", "test_loss", "train_loss")
    assert [{k: ln.get(k) for k in pick} for ln in lines] == [
        {k: ln.get(k) for k in pick} for ln in expected
    ]
    a, b = sim.strategy.released, oracle.strategy.released
    assert any(k.startswith("features.conv2") for k in a)  # stage 1 released at the run's end
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_measurement_covers_the_enclaves_code_and_config(monkeypatch):
    """The measurement hashes the code the enclaves run — attestation, the key agreement, the
    message encoding, the derived randomness and the model's code among it — and the config
    they apply (lr, momentum, min_cohort): an enclave measured with another lr has another
    measurement, and the server enclave refuses its report."""
    from fedge.methods.ppfl import enclaves as me
    from fedge.privacy.secagg.keys import KeyPair
    from fedge.privacy.tee import sign_report

    e = _Enclaves(_built(), cids=())
    spec, seen = e.spec, []
    real = me.measure
    monkeypatch.setattr(me, "measure", lambda mods, cfg: seen.append(mods) or real(mods, cfg))
    spec.measurement("client")
    names = {m.__name__ for m in seen[0]}
    model = {
        type(m).__module__
        for m in spec.template().modules()
        if type(m).__module__.startswith("fedge.")
    }
    assert {
        "fedge.privacy.tee.attest",
        "fedge.privacy.secagg.keys",
        "fedge.core.messages",
        spec.model_fn.__module__,
        "fedge.methods.ppfl.enclaves",
        "fedge.privacy.tee.channel",
        "fedge.core.rng",
    } | model <= names
    for k, v in (("lr", 0.5), ("momentum", 0.0), ("min_cohort", 1)):
        other = EnclaveSpec(
            spec.model_fn,
            spec.stages,
            spec.seed,
            spec.init_arrays,
            {**spec.config, k: v},
            spec.server_mb,
        )
        assert other.measurement("client") != spec.measurement("client")
    hello = e.server_call(op="hello", ids="5")
    report = sign_report(
        other.measurement("client"), KeyPair.generate().public, hello.config["challenge/5"]
    )
    reg = {
        "op": "register",
        "ids": "5",
        "measurement/5": report.measurement,
        "pk/5": report.public_key,
        "signature/5": report.signature,
    }
    assert e.server_call(**reg).config["refused"] == "5"


def test_too_few_rounds_for_the_stages_warn_at_build_naming_stages_and_rounds():
    with pytest.warns(
        UserWarning,
        match=r"rounds=2 cannot train all 3 stage\(s\) \(stages 0-2; 3 x 3 round\(s\) by "
        r"method.rounds_per_stage=3 = 9 rounds needed\): stage 0 gets 2 of its 3 rounds, "
        r"stages 1-2 never train; set rounds=9",
    ):
        _built(rounds=2, method={**_cfg()["method"], "rounds_per_stage": 3})
    with pytest.warns(UserWarning, match=r"only stages 0-1 will train, stage 2 never trains"):
        _built(rounds=2, method={**_cfg()["method"], "rounds_per_stage": None, "patience": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _built(rounds=3)  # 3 stages x 1 round: every stage trains, no warning


def _stage_ends(strategy, curve):
    """Feed ``strategy`` one evaluated round per validation accuracy of ``curve`` (each round's
    stage aggregated, as a real round's is) and return the rounds (1-based) that ended a stage."""
    ends = []
    for r, val in enumerate(curve, start=1):
        strategy._rnd, strategy.stage_aggregated = r, True
        line = {"test_accuracy": 0.5, "val_accuracy": val}
        if strategy.round_metrics(line)["stage_done"]:
            ends.append(r)
    return ends


def test_stage_patience_ends_a_stage_when_its_validation_accuracy_plateaus():
    method = {**_cfg()["method"], "rounds_per_stage": None}
    method.update(stage_patience=2, stage_min_delta=0.02)
    strategy = _built(rounds=40, method=method).method.strategy
    # stage 0: 0.60 rises; 0.61 and 0.615 rise by less than 0.02 (2 flat rounds) -> ends at 4;
    # stage 1: 0.50, 0.515 (flat 1), 0.55 (a rise above 0.50 + 0.02: reset), 0.56, 0.565 -> ends at 9;
    # stage 2 (the last): 0.7, then flat
    curve = [0.50, 0.60, 0.61, 0.615, 0.50, 0.515, 0.55, 0.56, 0.565, 0.7, 0.7, 0.7]
    assert _stage_ends(strategy, curve) == [4, 9, 12]
    assert strategy.stage == 2  # the last stage's end moves nothing on
    # stage_min_delta 0: any rise above the best counts, a tie does not
    method.update(stage_patience=1, stage_min_delta=0.0)
    strategy = _built(rounds=40, method=method).method.strategy
    assert _stage_ends(strategy, [0.5, 0.51, 0.51, 0.4, 0.4]) == [3, 5]


def test_stage_patience_off_by_default_and_needs_a_validation_set():
    strategy = _built(rounds=40, method={**_cfg()["method"], "rounds_per_stage": 5}).method.strategy
    assert _stage_ends(strategy, [0.5] * 6) == [5]  # a flat validation curve ends nothing early
    method = {**_cfg()["method"], "rounds_per_stage": None, "stage_patience": 2}
    strategy = _built(rounds=40, method=method).method.strategy
    strategy.stage_aggregated = True
    with pytest.raises(ConfigError, match="set dataset.validation"):
        strategy.round_metrics({"test_accuracy": 0.5})
    with pytest.raises(
        ConfigError, match="stage_min_delta=0.01 acts only with method.stage_patience"
    ):
        _built(method={**_cfg()["method"], "stage_min_delta": 0.01})


def test_stage_patience_follows_a_real_runs_validation_accuracy():
    """A real run with a validation set: each stage ends exactly where the rule, applied to the
    logged ``val_accuracy``, says it does."""
    method = {**_cfg()["method"], "rounds_per_stage": None, "stage_patience": 1}
    built = _built(rounds=6, method=method, **{"dataset.validation": 16})
    _, lines = _run(built, 6)
    best, stage, expected = -1.0, 0, []
    for ln in lines:
        assert ln["stage"] == stage
        done = best >= 0 and ln["val_accuracy"] <= best
        best = max(best, ln["val_accuracy"])
        expected.append(int(done))
        if done and stage < 2:
            stage, best = stage + 1, -1.0
    assert [ln["stage_done"] for ln in lines] == expected
    assert sum(expected) >= 1  # the curve did plateau somewhere in 6 rounds
