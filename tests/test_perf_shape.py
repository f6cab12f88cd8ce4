"""The all-reduce's shape found from how its time grows with the node count (birder_repro.perf.shape)."""

import math

import pytest

from birder_repro.perf.shape import Measured, ShapeFit, detect_shape, fit_shape, latency_steps, link_multiple

M = 4  # processes a node
SIZES = (4e6, 64e6, 680e6)


def _node_s(nbytes: float) -> float:  # a made-up 1-node all-reduce: 20 us a step, 10 GB/s
    return 2 * (M - 1) * 20e-6 + 2 * (M - 1) / M * nbytes / 10e9


def _made_up(truth: ShapeFit, counts=(2, 4), sizes=SIZES) -> list[Measured]:
    return [Measured(n, s, truth.seconds(s, n, M, _node_s(s))) for n in counts for s in sizes]


@pytest.mark.parametrize("shape", ["flat_ring", "two_level", "tree"])
def test_a_made_up_exchange_of_each_shape_is_found_with_its_link(shape):
    truth = ShapeFit(shape, alpha_s=50e-6, bytes_per_s=0.5e9)
    fit = detect_shape(_made_up(truth), M, _node_s)
    assert fit.shape == shape
    assert fit.bytes_per_s == pytest.approx(0.5e9, rel=1e-6)
    assert fit.alpha_s == pytest.approx(50e-6, rel=1e-4)
    assert fit.residual == pytest.approx(0.0, abs=1e-12)


def test_one_size_a_flat_ring_and_a_two_level_exchange_are_told_apart_by_their_growth():
    # the 1-bit Adam paper's Ethernet all-reduce grew x1.12 from 2 to 4 nodes of 4 (flat ring), the 1-bit LAMB
    # paper's InfiniBand one x1.6 beyond its 1-node part (two-level); a single vector size each
    flat = [Measured(2, 680e6, 1.897), Measured(4, 680e6, 2.133)]
    assert detect_shape(flat, 4, lambda s: 0.240).shape == "flat_ring"
    two = [Measured(2, 680e6, 0.270), Measured(4, 680e6, 0.339)]
    fit = detect_shape(two, 8, lambda s: 0.167)
    assert fit.shape == "two_level" and fit.alpha_s == 0.0  # one size: no latency separated from the rate


def test_a_shape_carries_the_measurement_to_more_nodes():
    truth = ShapeFit("two_level", alpha_s=30e-6, bytes_per_s=1e9)
    fit = detect_shape(_made_up(truth), M, _node_s)
    for n in (8, 16, 64):
        assert fit.seconds(100e6, n, M, _node_s(100e6)) == pytest.approx(truth.seconds(100e6, n, M, _node_s(100e6)))


def test_the_wrong_shape_leaves_a_residual():
    truth = ShapeFit("flat_ring", alpha_s=50e-6, bytes_per_s=0.5e9)
    points = _made_up(truth)
    assert fit_shape("two_level", points, M, _node_s).residual > 0.01
    assert fit_shape("tree", points, M, _node_s).residual > 1e-4


def test_formulas_at_known_points():
    assert latency_steps("flat_ring", 4, 4) == 30 and link_multiple("flat_ring", 4, 4) == pytest.approx(1.875)
    assert latency_steps("two_level", 4, 4) == 6 and link_multiple("two_level", 4, 4) == pytest.approx(1.5)
    assert latency_steps("tree", 5, 8) == 6 and link_multiple("tree", 5, 8) == 1.0
    assert latency_steps("tree", 1, 8) == 0 and link_multiple("two_level", 1, 8) == 0.0


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="two node counts"):
        detect_shape([Measured(2, 1e6, 1e-3), Measured(2, 2e6, 2e-3)], M)
    with pytest.raises(ValueError, match="unknown all-reduce shape"):
        latency_steps("butterfly", 2, 2)
    with pytest.raises(ValueError, match="bytes > 0"):
        detect_shape([Measured(2, 1e6, 0.0), Measured(4, 1e6, 1e-3)], M)


def test_a_node_phase_above_the_measured_times_leaves_no_fit():
    points = [Measured(2, 1e6, 1e-3), Measured(4, 1e6, 1.2e-3)]
    assert math.isinf(fit_shape("two_level", points, M, lambda s: 1.0).residual)
    with pytest.raises(ValueError, match="no shape fits"):
        detect_shape(points, M, lambda s: 1.0, shapes=("two_level", "tree"))
