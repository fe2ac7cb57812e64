"""benchmarks/eppfl_figures.py: its verdict lines against the paper's Figs. 2, 4 and 5 (hand-made
accuracies; nothing is trained)."""

from __future__ import annotations

from fedge.bench.stats import NO_INTERVAL
from tests_helpers import benchmark_script

bench = benchmark_script("eppfl_figures")


def test_fig2_one_seed_names_no_direction_and_which_way_the_point_estimates_go() -> None:
    other = bench.fig2_verdict(0.538, 0.760)
    assert f"direction {NO_INTERVAL}" in other
    assert "E = 2 ends at 0.538 and E = 5 at 0.760, the other way round" in other
    assert "the paper's way round" in bench.fig2_verdict(0.70, 0.60)


def test_dp_figures_are_called_not_comparable_only_when_every_epsilon_sits_at_chance() -> None:
    stuck = bench.dp_verdict({1.0: 0.100, 10.0: 0.100, 1000.0: 0.114})
    assert stuck.startswith("**Figs. 4 and 5 are not comparable with the paper's**")
    assert "every ε run (1, 10, 1000) ends at chance (final accuracy at most 0.114)" in stuck
    assert bench.dp_verdict({1.0: 0.100, 10.0: 0.45}) == ""  # ε = 10 trains: no such note
