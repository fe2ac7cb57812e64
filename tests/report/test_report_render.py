"""render_report: Markdown and self-contained HTML with the key numbers; number formats."""

from __future__ import annotations

import base64
import re

import pytest

from fedge.report import (
    format_accuracy,
    format_bytes,
    format_duration,
    format_flops,
    render_report,
)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1_000, "1.00 kB"),
        (1_234_567, "1.23 MB"),
        (56_700_000, "56.7 MB"),
        (123_400_000_000, "123 GB"),
        (-2_000, "-2.00 kB"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_format_bytes_exact_and_missing():
    assert format_bytes(1_234_567, exact=True) == "1.23 MB (1,234,567 B)"
    assert format_bytes(12, exact=True) == "12 B"
    assert format_bytes(None) == "—"


def test_format_flops_accuracy_duration():
    assert format_flops(2.5e9) == "2.50 GFLOP"
    assert format_flops(10**10, exact=True) == "10.0 GFLOP (10,000,000,000)"
    assert format_flops(512) == "512 FLOP"
    assert format_accuracy(0.875) == "87.50%"
    assert format_duration(12.34) == "12.3 s"
    assert format_duration(245) == "4 min 05 s"
    assert format_duration(7380) == "2 h 03 min"


def test_render_report_writes_md_and_html_with_key_numbers(make_run):
    path = make_run("fedavg-a", peak_bytes=3_500_000)
    md_path, html_path = render_report(path)
    assert (md_path, html_path) == (path / "report.md", path / "report.html")
    md, page = md_path.read_text(), html_path.read_text()
    assert md.startswith("# fedavg on cifar10 with cnn\n")
    for text in (md, page):
        assert "87.50%" in text  # final and best accuracy
        assert "5.00 MB (5,000,000 B)" in text  # total bytes down
        assert "1.25 MB (1,250,000 B)" in text  # total bytes up
        assert "10.0 GFLOP (10,000,000,000)" in text
        assert "62,006" in text and "248 kB (248,024 B)" in text
        assert "3.50 MB (3,500,000 B)" in text  # peak memory
        assert "dirichlet" in text and "complete" in text
    assert "```yaml\nseed: 7\n" in md
    assert "![Test accuracy per round](plots/accuracy.png)" in md
    assert (path / "plots" / "accuracy.png").is_file()


def test_html_is_self_contained_with_embedded_pngs(make_run):
    _, html_path = render_report(make_run())
    page = html_path.read_text()
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(uris) == 5
    assert all(base64.b64decode(u)[:8] == b"\x89PNG\r\n\x1a\n" for u in uris)
    assert "<style>" in page
    # nothing fetched from anywhere: no URLs, no linked files
    assert not re.search(r"https?://|<link|<script|src=\"(?!data:)", page)


def test_incomplete_run_report_says_so(make_run):
    md_path, html_path = render_report(make_run(accuracies=(0.3, 0.6, None), complete=False))
    assert "incomplete (3 rounds so far)" in md_path.read_text()
    assert "incomplete (3 rounds so far)" in html_path.read_text()
    assert "60.00%" in md_path.read_text()


def test_long_runs_and_many_clients_are_summarized(make_run):
    path = make_run(accuracies=[0.01 * r for r in range(1, 101)], num_clients=1000)
    md = render_report(path)[0].read_text()
    assert "… 90 more rounds …" in md and "… 990 more clients …" in md
    assert md.count("\n| ") < 80  # two elided tables plus the small ones, not 1100 rows
    assert "1.00%" in md and "100.00%" in md  # first and last rounds shown


def test_extra_metrics_appear_in_the_round_table(make_run):
    md = render_report(make_run(extra={"zo_grad_norm": 3.5}))[0].read_text()
    assert "zo_grad_norm" in md and "3.5" in md


def test_secure_aggregation_bytes_split_in_the_round_table(make_run):
    """A secure round's payload and protocol bytes (schema.PAYLOAD_BYTES_*, SECAGG_BYTES_*) are
    columns in bytes beside the totals."""
    extra = {"payload_bytes_down": 20_800, "payload_bytes_up": 41_120}
    extra |= {"secagg_bytes_down": 4_395, "secagg_bytes_up": 3_680}
    md = render_report(make_run(extra=extra))[0].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| round |"))
    assert "| bytes down | bytes up | payload down | payload up |" in header
    assert "secagg_bytes_down" in header and "secagg_bytes_up" in header
    row = next(line for line in md.splitlines() if line.startswith("| 1 |"))
    assert all(t in row for t in ("20.8 kB", "41.1 kB", "4.39 kB", "3.68 kB")), row


def test_partition_summary_oracle(make_run):
    # client i holds 10*(i+1) samples, all of class i % 3: samples 10/25/40, one class each
    md = render_report(make_run(num_clients=4))[0].read_text()
    assert "| samples per client (min / median / max) | 10 / 25 / 40 |" in md
    assert "| classes present per client (min / median / max) | 1 / 1 / 1 |" in md


def test_partition_section_reads_the_written_keys(make_run):
    # client 2 holds 30 samples of class 2; the histogram row names it by its id
    md = render_report(make_run(num_clients=4))[0].read_text()
    assert "| 2 | 30 | 1 | 2:30 |" in md
    assert "| classes | 3 |" in md and "| samples in total | 100 |" in md


def test_report_of_a_real_dirichlet_run_shows_label_histograms(tmp_path, tiny):
    """A real run with Dirichlet(0.1): the report's Partition section comes from the
    partition.json the run wrote, and every client row has a non-empty histogram."""
    import json

    from fedge.core.config import load_config
    from fedge.experiment.run import run_experiment

    cfg = tiny(
        rounds=1,
        partition={"name": "dirichlet", "alpha": 0.1},
        dataset={"name": "digits"},
        clients={"num": 5, "per_round": 5},
    )
    out = run_experiment(load_config(cfg), out=tmp_path / "run", render=False)
    part = json.loads((out / "partition.json").read_text())
    md = render_report(out)[0].read_text()
    section = md.split("## Partition")[1].split("## Config")[0]
    rows = [r for r in section.splitlines() if re.match(r"\| \d+ \| ", r)]
    assert len(rows) == 5
    for row, client in zip(rows, part["clients"], strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        counts = client["label_counts"]
        top = max(range(len(counts)), key=lambda k: (counts[k], k))
        assert cells[0] == str(client["client"]) and cells[2] == str(client["num_labels"])
        assert cells[3].startswith(f"{top}:{counts[top]}")  # largest class first
    assert "0 / 0 / 0" not in section


def test_a_warm_started_runs_report_states_the_public_size_and_server_flops(make_run):
    import json

    path = make_run("warm")
    md = render_report(path)[0].read_text()
    assert "server warm start" not in md  # no warm start: no rows
    summary = json.loads((path / "summary.json").read_text())
    summary["warm_start"] = {"public": 2000, "server_flops": 1_022_720_000}
    (path / "summary.json").write_text(json.dumps(summary))
    md = render_report(path)[0].read_text()
    assert "| server warm start: public samples | 2,000 |" in md
    assert "| server warm start: FLOPs (not client FLOPs) | 1.02 GFLOP (1,022,720,000) |" in md
    assert "10.0 GFLOP (10,000,000,000)" in md  # the clients' total, unchanged


def test_an_eppfl_run_with_the_papers_sensitivity_is_reported_without_a_dp_guarantee(make_run):
    import yaml

    for sensitivity, warned in (("paper", True), ("rigorous", False)):
        path = make_run(f"eppfl-{sensitivity}", method="eppfl")
        cfg = yaml.safe_load((path / "config.yaml").read_text())
        cfg["method"]["dp"] = {"epsilon": 5.0, "sensitivity": sensitivity}
        (path / "config.yaml").write_text(yaml.safe_dump(cfg))
        md = render_report(path)[0].read_text()
        assert ("**No DP guarantee: the scale depends on the data it protects.**" in md) is warned
