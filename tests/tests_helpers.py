"""Helpers shared by test modules (imported as a plain module: tests/ is on sys.path)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

WALL_KEYS = {"wall_s", "client_wall_s"}


class Interrupt(Exception):
    """The crash :func:`run_cut_after` simulates."""


def run_cut_after(cfg: dict, out: Path, cut_round: int, monkeypatch, **run_kwargs) -> None:
    """Run ``cfg`` into ``out`` (``run_experiment``'s keywords: ``runtime``, ...) and crash it
    right after round ``cut_round``'s checkpoint (as a kill between rounds would leave it)."""
    import pytest

    import fedge.experiment.rundir as rd
    from fedge.core.config import load_config
    from fedge.experiment.run import run_experiment

    original = rd.RunDir.save_checkpoint

    def crash_after_the_cut(self, state):
        original(self, state)
        if state["record"]["round"] == cut_round:
            raise Interrupt

    monkeypatch.setattr(rd.RunDir, "save_checkpoint", crash_after_the_cut)
    with pytest.raises(Interrupt):
        run_experiment(load_config(cfg), out=out, render=False, **run_kwargs)
    monkeypatch.setattr(rd.RunDir, "save_checkpoint", original)


def metrics_without_wall(run_dir: str | Path) -> list[dict]:
    """metrics.jsonl of a run, minus wall-clock fields (which legitimately differ)."""
    lines = [
        json.loads(x)
        for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
        if x.strip()
    ]
    return [{k: v for k, v in line.items() if k not in WALL_KEYS} for line in lines]


_UNFINISHED_COMMON = ["eval_every=1", "clients.num=4", "clients.per_round=2", "threads=1"]


def unfinished_run(path: Path, rounds: int, seed: int = 0) -> Path:
    """A run of ``rounds + 2`` rounds stopped after ``rounds``: run that far, then widen its
    config the way a killed run looks (incomplete, checkpoint at ``rounds``)."""
    from fedge.core.config import load_config
    from fedge.experiment.run import run_experiment

    overrides = [*_UNFINISHED_COMMON, f"rounds={rounds}", f"seed={seed}"]
    run_experiment(load_config("quickstart", overrides=overrides), out=path, render=False)
    (path / "summary.json").unlink()
    for name in ("config.yaml", ".fedge-config.json"):
        text = (path / name).read_text()
        (path / name).write_text(
            text.replace(f"rounds: {rounds}\n", f"rounds: {rounds + 2}\n").replace(
                f'"rounds": {rounds},', f'"rounds": {rounds + 2},'
            )
        )
    return path


def benchmark_script(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module (the scripts are not a package)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def record_replies(sim) -> dict[tuple[int, int], list[int]]:
    """Wrap ``sim``'s exchanges (an engine ``Simulation``) to record the clients that replied to
    each, by (round, exchange); returns the dict it fills as the rounds run."""
    got: dict[tuple[int, int], list[int]] = {}
    exchange = sim._exchange

    def recording(rnd, phase, messages, acc):
        replies = exchange(rnd, phase, messages, acc)
        got[(rnd, phase)] = sorted(replies)
        return replies

    sim._exchange = recording
    return got


def missed_rounds(seed: int, rounds: int, num: int, per_round: int) -> dict[int, dict[int, int]]:
    """Round r -> {client sampled in r: the rounds of updates it lacks and is sent}: r − the last
    round it took part in, or r − 1 when it took part in none (it builds the seeded initial
    model W_1 itself). For a run of a seeds-and-scalars method (FedKSeed, DeComFL) with the
    engine's sampling in which every sampled client replies."""
    from fedge.runtime.engine import sample_clients

    last: dict[int, int] = {}
    out: dict[int, dict[int, int]] = {}
    for rnd in range(1, rounds + 1):
        ids = sample_clients(seed, rnd, num, per_round)
        out[rnd] = {c: rnd - last.get(c, 1) for c in ids}
        last.update(dict.fromkeys(ids, rnd))
    return out


def record_downlink(monkeypatch, strategy_cls: type) -> dict[int, dict[int, int]]:
    """Round -> {client: the serialized size of the message ``strategy_cls.configure_round``
    made for it}, filled as a run goes: the method's own messages, before any wrapper (secure
    aggregation) adds to them."""
    sizes: dict[int, dict[int, int]] = {}
    original = strategy_cls.configure_round

    def spy(self, rnd, client_ids):
        out = original(self, rnd, client_ids)
        sizes[rnd] = {c: len(m.to_bytes()) for c, m in out.items()}
        return out

    monkeypatch.setattr(strategy_cls, "configure_round", spy)
    return sizes


def check_scalar_bytes(
    lines: list[dict],
    missed: dict[int, dict[int, int]],
    sent: dict[int, dict[int, int]],
    *,
    up: int,
    down: int,
    secure: bool,
) -> None:
    """Each round's logged payload against a seeds-and-scalars formula, within 64 bytes of
    framing a message: every client sends ``up`` bytes; client c is sent 8 bytes (the run's
    seed, in every message) and ``down`` bytes per round it missed (``missed``:
    :func:`missed_rounds`), each message on its own (``sent``: :func:`record_downlink`), and
    the logged downlink payload is their sum. The payload is ``payload_bytes_*`` under secure
    aggregation, which with ``secagg_bytes_*`` sums to ``bytes_*``; else ``bytes_*`` itself."""
    assert [line["round"] for line in lines] == sorted(missed) == sorted(sent)
    for line in lines:
        rnd = line["round"]
        n = len(missed[rnd])
        if secure:
            for way in ("down", "up"):
                payload, rest = line[f"payload_bytes_{way}"], line[f"secagg_bytes_{way}"]
                assert payload + rest == line[f"bytes_{way}"] and rest > 0, line
            got_down, got_up = line["payload_bytes_down"], line["payload_bytes_up"]
        else:
            assert not any(k.startswith(("payload_", "secagg_")) for k in line), line
            got_down, got_up = line["bytes_down"], line["bytes_up"]
        assert n * up <= got_up <= n * (up + 64), (rnd, got_up, n, up)
        assert sorted(sent[rnd]) == sorted(missed[rnd]) and got_down == sum(sent[rnd].values())
        for c, size in sent[rnd].items():
            want = 8 + down * missed[rnd][c]
            assert want <= size <= want + 64, (rnd, c, missed[rnd][c], size, want)


def check_unit_records_round_trip(bench, tiny, *, section, header, seeds, labels, tmp_path, capsys):
    """A records script (``fedge.bench.unit_records``) at a tiny size: one record and one figures
    record per finished run; with the run directories gone, ``--table-only`` prints the same
    section and ``--estimate`` finds nothing left to run."""
    import shutil

    from fedge.bench.docs import records_line

    records, docs = tmp_path / "records", tmp_path / "benchmarks.md"
    argv = [*tiny, "--records", str(records)]
    assert bench.main([*argv, "--out", str(tmp_path / "runs"), "--docs", str(docs)]) == 0
    first = capsys.readouterr().out
    assert header in first and "Awaiting records" not in first
    for kind in ("runs", "figures"):
        for seed in seeds:
            got = sorted(p.name for p in (records / kind / f"seed-{seed}").iterdir())
            assert got == sorted(f"{label}.json" for label in labels), (kind, seed, got)
    text = docs.read_text()
    assert f"<!-- bench:{section} -->" in text and records_line(records) in text
    shutil.rmtree(tmp_path / "runs")
    assert bench.main([*argv, "--table-only"]) == 0
    assert capsys.readouterr().out == first
    assert bench.main([*argv, "--estimate"]) == 0
    runs = len(labels) * len(seeds)
    assert capsys.readouterr().out.startswith(f"0 of {runs} runs not yet recorded: about 0 ")


def check_unit_records_awaiting(bench, tiny, *, header, seeds, labels, tmp_path, capsys):
    """Without records, a records script's section lists every run as awaiting, seed by seed."""
    assert bench.main([*tiny, "--records", str(tmp_path / "none"), "--table-only"]) == 0
    out = capsys.readouterr().out
    assert header not in out
    awaiting = out.split("Awaiting records (runs to come): ")[1].strip().rstrip(".").split(", ")
    assert awaiting == [f"{label}@{s}" for s in seeds for label in labels]


def check_measured_script(
    bench: ModuleType, argv: list[str], *, section, tmp_path: Path, measuring: str = "measure"
) -> dict:
    """Run the measuring script ``bench`` (its ``main``) with ``argv`` and ``--docs`` into
    ``tmp_path/docs/benchmarks.md``: its record is ``tmp_path/benchmarks/results/measured/
    <section>.json`` and the section is that record rendered (the record's machine line, then
    ``section.markdown(report, command)``); ``--table-only`` then renders it again byte-identical
    without measuring (``bench.<measuring>`` fails there). A record kept under ``--records``
    names its folder. Returns the record."""
    import re

    import pytest

    from fedge.bench.measured import opening_line

    docs = tmp_path / "docs" / "benchmarks.md"
    assert bench.main([*argv, "--docs", str(docs)]) == 0
    where = f"benchmarks/results/measured/{section.name}.json"
    record = json.loads((tmp_path / where).read_text())
    assert (record["section"], record["title"]) == (section.name, section.title)
    block = re.search(
        rf"<!-- bench:{section.name} -->\n(.*?)\n<!-- /bench:{section.name} -->",
        docs.read_text(),
        re.S,
    )
    assert block, f"no section {section.name} in {docs}"
    body = section.markdown(record["report"], record["command"]).rstrip()
    assert block.group(1) == f"## {section.title}\n\n{opening_line(record, where)}\n\n{body}"
    first = docs.read_text()
    docs.write_text(first.replace(body, "stale"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench, measuring, lambda *a, **k: pytest.fail("--table-only measured"))
        assert bench.main([*argv, "--table-only", "--docs", str(docs)]) == 0
    assert docs.read_text() == first
    elsewhere = tmp_path / "records"
    (elsewhere / f"{section.name}.json").parent.mkdir()
    (tmp_path / where).rename(elsewhere / f"{section.name}.json")
    argv = [*argv, "--table-only", "--docs", str(docs), "--records", str(elsewhere)]
    assert bench.main(argv) == 0
    assert f"Record: `records/{section.name}.json`." in docs.read_text()
    return record


def check_measured_script_errors(bench: ModuleType, argv: list[str], *, tmp_path: Path, capsys):
    """``--table-only`` of the script ``bench`` with no record, and without ``--docs``: exit 2
    with one line naming the path (or the missing flag) and the fix; the docs are not touched."""
    import pytest

    docs = tmp_path / "docs" / "benchmarks.md"
    for extra, needle in (
        (["--docs", str(docs)], "no record of the measured section"),
        ([], "--table-only re-renders a docs section: give --docs FILE"),
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            bench.main([*argv, "--table-only", *extra])
        err = capsys.readouterr().err
        assert e.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
        if extra:
            assert str(tmp_path / "benchmarks/results/measured") in err
    assert not docs.exists()


def local_heads_section(**extra) -> dict:
    """A small BAFFLE section: activity perturbation with a head closing the LeNet's conv1 block,
    persistent client Adam (fedge.methods.baffle.heads)."""
    return {
        "name": "baffle",
        "k": 8,
        "sigma": 1e-3,
        "batch_size": 16,
        "max_steps": 3,
        "estimator": "activity",
        "local_heads": ["features.conv1"],
        "ema": None,
        "client_optimizer": {"name": "adam", "lr": 0.01, "state": "persistent"},
        **extra,
    }
