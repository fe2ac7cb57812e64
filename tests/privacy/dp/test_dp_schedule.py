"""Shuffled passes give each client at most once per pass; Poisson has the right mean."""

from fedge.privacy.dp.schedule import poisson_clients, secret_clients, shuffled_clients


def test_shuffled_each_client_once_per_pass_and_reproducible():
    n, m = 23, 5  # R = 4 rounds per pass, 3 clients idle each pass
    for p in range(3):
        seen = [
            c
            for r in range(4 * p + 1, 4 * p + 5)
            for c in shuffled_clients(7, r, population=n, clients_per_round=m)
        ]
        assert len(seen) == len(set(seen)) == 20 and all(0 <= c < n for c in seen)
    assert shuffled_clients(7, 5, population=n, clients_per_round=m) == shuffled_clients(
        7, 5, population=n, clients_per_round=m
    )
    assert shuffled_clients(7, 1, population=n, clients_per_round=m) != shuffled_clients(
        7, 5, population=n, clients_per_round=m
    )


def test_poisson_mean_count():
    counts = [
        len(poisson_clients(0, r, population=2000, clients_per_round=20)) for r in range(1, 201)
    ]
    assert abs(sum(counts) / len(counts) - 20) < 1.5  # sd of the mean ≈ √20/√200 ≈ 0.32
    assert len(set(counts)) > 1  # the count varies


def test_secret_clients_fixed_is_an_m_subset_and_poisson_has_mean_qn():
    for _ in range(20):
        got = secret_clients("fixed", population=50, clients_per_round=7)
        assert got == sorted(set(got)) and len(got) == 7 and set(got) <= set(range(50))
    counts = [
        len(secret_clients("poisson", population=2000, clients_per_round=20)) for _ in range(200)
    ]
    # not seeded: the mean of 200 Binomial(2000, 0.01) counts has sd ≈ 0.31; 3.0 is ~10 sd
    assert abs(sum(counts) / len(counts) - 20) < 3.0 and len(set(counts)) > 1
