"""Cost per million tokens."""

import pytest

from specpilot.perf.cost import cost_per_million_tokens


def test_cost_formula():
    # one $3/h GPU at 1000 tok/s: 3.6e6 tokens per hour cost $3 -> $0.8333 per million
    assert cost_per_million_tokens(3.0, 1, 1000.0) == pytest.approx(3.0 / 3.6)
    assert cost_per_million_tokens(2.0, 4, 500.0) == pytest.approx(2.0 * 4 / (3600 * 500) * 1e6)


def test_faster_replica_costs_less_per_token():
    assert cost_per_million_tokens(2.5, 1, 2000.0) == pytest.approx(cost_per_million_tokens(2.5, 1, 1000.0) / 2)


@pytest.mark.parametrize(
    ("args", "name"),
    [((0.0, 1, 100.0), "price_per_gpu_hour"), ((-1.0, 1, 100.0), "price_per_gpu_hour"),
     ((1.0, 0, 100.0), "gpus_per_replica"), ((1.0, 1, 0.0), "tokens_per_second_per_replica")],
)
def test_non_positive_inputs_name_the_argument(args, name):
    with pytest.raises(ValueError, match=name):
        cost_per_million_tokens(*args)
