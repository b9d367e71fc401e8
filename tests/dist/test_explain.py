"""minichain.dist.explain: the step plan and the alpha-beta prediction.

Most tests use a stand-in communicator (name, rank, size, dtype): explain
only reads those unless asked to calibrate, which runs under mpiexec.
"""
import re
import types

import numpy
import pytest

import minichain
from minichain import links as L
from minichain.dist.trace import cost_model
from minichain.dist.transports.pipeline import PIPELINE_BYTES, cut
from tests.dist._launch import require_mpi, run_mpi

ALPHA, BW = 1e-3, 1e6  # big enough to read from the text's 4 digits


def _comm(name='flat', size=4, rank=0, dtype=None):
    # pieces: as a communicator with the pipeline layer cuts host buffers
    return types.SimpleNamespace(name=name, size=size, rank=rank,
                                 allreduce_grad_dtype=dtype,
                                 pieces=lambda buf: cut(buf, PIPELINE_BYTES))


def _model(dtype=numpy.float32):
    model = minichain.Sequential(L.Linear(3, 4), L.Linear(4, 2))
    for p in model.params():
        p.array = p.array.astype(dtype)
    return model


def _predicted_ms(text):
    return float(re.search(r'predicted allreduce time per step: (\S+) ms',
                           text).group(1))


def _rows(text):
    return [line.split() for line in text.splitlines()
            if re.match(r'\s+\d+\s+/', line)]


def test_ring_allreduce_time():
    assert cost_model.ring_allreduce_time(10 ** 6, 1, 1.0, 1.0) == 0.0
    assert cost_model.ring_allreduce_time(10 ** 6, 4, 1e-5, 1e9) == \
        pytest.approx(1.5e-3 + 6e-5)


def test_flat_rows_offsets_total_and_prediction():
    seen = []
    text = cost_model.explain(_model(), _comm(), latency=ALPHA,
                              bandwidth=BW, out=seen.append)
    assert seen == [text]
    rows = _rows(text)
    assert [r[1] for r in rows] == ['/0/W', '/0/b', '/1/W', '/1/b']
    nbytes = [48, 16, 32, 8]
    assert [int(r[-2].replace(',', '')) for r in rows] == nbytes
    assert [int(r[-1].replace(',', '')) for r in rows] == [0, 48, 64, 96]
    assert 'total: 4 parameters, 104 bytes' in text
    assert 'flat communicator, 4 ranks' in text
    assert 'transfer dtype float32' in text
    expected = cost_model.ring_allreduce_time(104, 4, ALPHA, BW)
    assert _predicted_ms(text) == pytest.approx(expected * 1e3, rel=1e-3)
    assert '(given)' in text


def test_naive_pays_the_latency_once_per_parameter():
    text = cost_model.explain(_model(), _comm('naive'), latency=ALPHA,
                              bandwidth=BW, out=None)
    expected = sum(cost_model.ring_allreduce_time(n, 4, ALPHA, BW)
                   for n in (48, 16, 32, 8))
    assert _predicted_ms(text) == pytest.approx(expected * 1e3, rel=1e-3)
    assert '4 messages' in text


def test_flat_counts_its_pipeline_chunks():
    model = minichain.Sequential(L.Linear(PIPELINE_BYTES // 4 // 2 + 1, 3))
    total = sum(p.size for p in model.params()) * 4
    text = cost_model.explain(model, _comm(), latency=ALPHA, bandwidth=BW,
                              out=None)
    assert '2 chunks' in text
    expected = (cost_model.ring_allreduce_time(PIPELINE_BYTES, 4, ALPHA, BW)
                + cost_model.ring_allreduce_time(total - PIPELINE_BYTES, 4,
                                                 ALPHA, BW))
    assert _predicted_ms(text) == pytest.approx(expected * 1e3, rel=1e-3)


def test_ring_is_named_and_predicted_as_flat():
    model = _model()
    ring = cost_model.explain(model, _comm('ring'), latency=ALPHA,
                              bandwidth=BW, out=None)
    flat = cost_model.explain(model, _comm(), latency=ALPHA, bandwidth=BW,
                              out=None)
    assert 'the ring allreduce (minichain.dist.ring' in ring
    assert 'MPI Allreduce of the packed' in flat
    assert 'minichain.dist.ring' not in flat
    assert _predicted_ms(ring) == _predicted_ms(flat)


def test_transfer_dtype_sets_the_bytes():
    text = cost_model.explain(_model(numpy.float64),
                              _comm(dtype=numpy.dtype(numpy.float32)),
                              out=None)
    assert 'transfer dtype float32' in text
    assert 'total: 4 parameters, 104 bytes' in text
    wide = cost_model.explain(_model(numpy.float64), _comm(), out=None)
    assert 'total: 4 parameters, 208 bytes' in wide


def test_nccl_communicator_on_numpy_arrays_says_it_uses_mpi():
    text = cost_model.explain(_model(), _comm('pure_nccl'), out=None)
    assert 'the flat MPI path, not NCCL' in text
    alpha, bandwidth = cost_model.DEFAULTS['mpi']
    assert 'MPI: alpha = {:.4g} us, B = {:.4g} GB/s (default)'.format(
        alpha * 1e6, bandwidth / 1e9) in text


def test_uninitialized_parameters_are_named_not_counted():
    model = minichain.Sequential(L.Linear(3, 4), L.Linear(None, 2))
    text = cost_model.explain(model, _comm(), out=None)
    assert 'not counted (uninitialized; run one forward pass): /1/W' in text
    assert 'total: 3 parameters' in text


def test_step_time_and_batch_size():
    text = cost_model.explain(_model(), _comm(), batch_size=8,
                              step_time=0.01, latency=ALPHA, bandwidth=BW,
                              out=None)
    t = cost_model.ring_allreduce_time(104, 4, ALPHA, BW)
    assert 'global batch: 8 per rank x 4 = 32' in text
    assert 'scaling efficiency {:.1%}'.format(0.01 / (0.01 + t)) in text
    assert 'predicted throughput: {:,.1f} samples/s'.format(
        32 / (0.01 + t)) in text


def test_only_rank0_prints_and_one_rank_costs_nothing():
    seen = []
    text = cost_model.explain(_model(), _comm(rank=1), out=seen.append)
    assert seen == [] and text
    one = cost_model.explain(_model(), _comm(size=1), out=None)
    assert _predicted_ms(one) == 0.0


def test_exported_as_a_function_of_minichain_dist():
    from minichain import dist
    assert dist.explain is cost_model.explain
    assert 'explain' in dist.__all__


@pytest.mark.mpi
def test_calibrated_explain_under_mpiexec(tmp_path):
    require_mpi()
    res = run_mpi(2, 'timeline_job.py', tmp_path, 'explain', timeout=60)
    assert not res.timed_out and res.returncode == 0, res.output[-4000:]
    texts = [(tmp_path / 'explain{}.txt'.format(r)).read_text()
             for r in range(2)]
    assert texts[0] == texts[1]  # the ranks agreed on the measurement
    assert res.output.count('explain: flat communicator, 2 ranks') == 1
    measured = re.search(r'MPI: alpha = (\S+) us, B = (\S+) GB/s \(measured\)',
                         texts[0])
    assert measured, texts[0]
    alpha_us, gbs = float(measured.group(1)), float(measured.group(2))
    assert 0 < alpha_us < 1e5 and gbs > 0
    expected = cost_model.ring_allreduce_time(264, 2, alpha_us * 1e-6,
                                              gbs * 1e9)
    assert _predicted_ms(texts[0]) == pytest.approx(expected * 1e3, rel=1e-2)
