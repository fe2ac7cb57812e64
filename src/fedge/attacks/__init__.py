"""Privacy attacks as measurements: each consumes what an adversary observes of a real run
(:mod:`~fedge.attacks.observe`, :mod:`~fedge.attacks.harness`, :mod:`~fedge.attacks.edge_view`),
never a method's internals. Data reconstruction: :mod:`~fedge.attacks.reconstruct` (DLG, Zhu et
al., NeurIPS 2019; Inverting Gradients, Geiping et al., NeurIPS 2020) and
:mod:`~fedge.attacks.reconstruct_run`, scored by :mod:`~fedge.attacks.images`; activation
inversion at an edge server: :mod:`~fedge.attacks.inversion`; membership inference:
:mod:`~fedge.attacks.membership` (loss threshold, shadow models, offline LiRA of Carlini et al.,
S&P 2022), :mod:`~fedge.attacks.membership_run`, :mod:`~fedge.attacks.completion`; property
inference (Melis et al., S&P 2019): :mod:`~fedge.attacks.property`; every method's leakage
table: :mod:`~fedge.attacks.table`. See docs/privacy/attacks.md.
"""
