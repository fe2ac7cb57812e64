"""Privacy attacks as measurements (issue 12; PPFL seed 001, Section 3 and Table 2).

An attack consumes *observations* — what an adversary actually sees — and never reaches into
a method's internals:

- :mod:`fedge.attacks.observe`: :class:`Observer`, a strategy wrapper that records every
  exchange of a round (the server's outgoing messages and each client's reply as it
  arrives, before aggregation), and :func:`server_views`, which reads each client's upload
  out of those records the way an honest-but-curious server would (plain arrays, or the
  fixed-point vector of a secure-aggregation masked input); :func:`observe_parties`
  records what a side party receives (EPPFL's edge server: the released activations).
- :mod:`fedge.attacks.reconstruct`: data reconstruction — DLG (Zhu et al. 2019) gradient
  matching with iDLG label extraction, against a gradient, against BAFFLE's Stein estimate,
  and matching BAFFLE's K loss differences directly.
- :mod:`fedge.attacks.inversion`: EPPFL's released (kept, clipped, noisy) activations
  inverted to the input with M_c (model inversion at the edge server).
- :mod:`fedge.attacks.membership`: membership inference on a released model (the final one,
  or the global model broadcast after any round, :func:`~fedge.attacks.membership_run.membership_by_round`): loss threshold
  (Yeom et al. 2018), shadow models (Shokri et al. 2017), offline LiRA (Carlini et al. 2022).
  Members are samples of clients whose replies were aggregated (the engine records them, the
  run summary's ``first_aggregated``): a client the run never sampled holds samples it never saw.
- :mod:`fedge.attacks.property`: property inference from uploads (Melis et al. 2019).
- :mod:`fedge.attacks.completion`: the attacker's own classifier atop released feature layers
  (membership inference when the last layer is withheld, as PPFL can keep it in the TEEs).
- :mod:`fedge.attacks.harness`: one short instrumented run, the attacks, and the baselines.
- :mod:`fedge.attacks.membership_run`: membership inference against a run's released or
  broadcast models, members drawn from the clients it trained on, shadow models.
- :mod:`fedge.attacks.table`: the leakage table of every method (DRA, MIA, PIA per row).
"""
