"""minichain.dist.testing pieces that run on one process.

Under MPI it is tested by workers/checks_model.py (test_battery.py, 1-4
ranks, including its refusal on one rank) and by test_pytest_plugin.py (a
user's test file run by plain pytest).
"""
import numpy
import pytest

import minichain
from minichain import optimizers
from minichain.dist.testing import equivalence


def _mismatches(got, want):
    out = []
    equivalence._compare_group([('w', got, want)], 0, 1e-10, 0.0, out)
    return out


def test_float64_tolerance_is_1e_10_of_the_largest_reference_value():
    want = numpy.array([2.0, -1.0, 1e-20])
    assert not _mismatches(want * (1 + 4e-11), want)
    out = _mismatches(want + numpy.array([0, 3e-10, 0]), want)
    assert len(out) == 1, out
    for part in ('w on rank 0', 'worst element (1,)', 'rtol 1e-10',
                 'largest |single-process| value 2'):
        assert part in out[0], out[0]
    # A value that is zero up to roundoff is measured against the largest.
    assert not _mismatches(numpy.array([2.0, -1.0, 1e-12]), want)
    assert _mismatches(numpy.array([2.0, numpy.nan, 0.0]), want)
    assert 'shape (2,) vs single-process (3,)' in _mismatches(
        want[:2], want)[0]


def _ratio_note(got, want, size=2, rtol=1e-10):
    out, notes = [], []
    equivalence._compare_group(
        [('a', got[:2], want[:2]), ('b', got[2:], want[2:])], 0, rtol, 0.0,
        out, ratio_of=('step 1, the gradients', size, notes))
    assert out and len(notes) == 1, (out, notes)
    return notes[0]


@pytest.mark.parametrize('size', [2, 3])
def test_gradients_summed_over_the_ranks_are_named(size):
    want = numpy.array([0.5, -1.0, 2.0, 3e-3])
    note = _ratio_note(want * size, want, size)
    assert note.startswith('step 1, the gradients: data-parallel / '
                           'single-process = {} for every element, which is '
                           '{} = the number of ranks: the gradients are '
                           'summed over the ranks, not averaged'.format(
                               size, size)), note


@pytest.mark.parametrize('size', [2, 4])
def test_a_loss_summed_over_the_batch_is_named(size):
    want = numpy.array([0.5, -1.0, 2.0, 3e-3])
    note = _ratio_note(want / size, want, size, rtol=1e-4)
    assert note.startswith('step 1, the gradients: data-parallel / '
                           'single-process = {:.6g} for every element, which '
                           'is 1/{} = one over the number of ranks: most '
                           'likely the loss is summed over the batch instead '
                           'of averaged'.format(1 / size, size)), note


def test_another_ratio_is_stated_without_a_cause():
    want = numpy.array([0.5, -1.0, 2.0, 3e-3])
    note = _ratio_note(want * 1.5, want)
    assert note == ('step 1, the gradients: data-parallel / single-process '
                    '= 1.5 for every element'), note
    # Not one ratio (here 2 for a and 1 for b): the fit, said to be one.
    note = _ratio_note(want * [2, 2, 1, 1], want)
    assert note.endswith('(least squares; no one ratio fits every '
                         'element)') and 'which is' not in note, note
    assert _ratio_note(want * 0 + 1, want * 0) == \
        'step 1, the gradients: no ratio to state'
    assert _ratio_note(want[:1], want) == \
        'step 1, the gradients: no ratio to state'  # shapes differ
    assert not _mismatches(want, want)  # and no note without a mismatch


class _Quadratic(minichain.Link):
    """loss = sum(w * w) / 2, so the gradient is w."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.w = minichain.Parameter(numpy.array([1.0, -2.0]))

    def loss(self):
        return minichain.functions.sum(self.w * self.w) * 0.5


def _run(lag, calls):
    link = _Quadratic()
    opt = equivalence._LaggedOptimizer(optimizers.SGD(lr=0.5).setup(link), lag)
    stepped = [opt.update(link.loss) for _ in range(calls)]
    return link.w.array, stepped, opt.optimizer.t


def test_one_step_stale_reference_applies_the_previous_gradient():
    # w1 = w0 - lr g(w0) (the gradient of the first call, applied at the
    # second); w2 = w1 - lr g(w0) (computed at the second call, at w0);
    # w3 = w2 - lr g(w1).
    w0 = numpy.array([1.0, -2.0])
    w1 = w0 - 0.5 * w0
    w2 = w1 - 0.5 * w0
    w3 = w2 - 0.5 * w1
    w, stepped, t = _run(lag=1, calls=4)
    numpy.testing.assert_allclose(w, w3, rtol=1e-15)
    assert stepped == [False, True, True, True] and t == 3


def test_no_lag_is_the_plain_optimizer():
    w, stepped, t = _run(lag=0, calls=3)
    numpy.testing.assert_allclose(w, [0.125, -0.25], rtol=1e-15)
    assert stepped == [True] * 3 and t == 3


def test_an_option_the_reference_cannot_follow_is_refused():
    with pytest.raises(ValueError, match=r"multi_node_options \['overlapp'\] "
                       r"\(known: \['accumulate', 'bucket_mb', "
                       r"'double_buffering', 'nan_check', 'overlap', "
                       r"'shard_state', 'zero_fill'\]\)"):
        equivalence.assert_data_parallel_equivalent(
            None, None, None, None, multi_node_options={'overlapp': True})


def test_micro_batches_cut_each_shard_and_join_them_by_position():
    mine, whole = equivalence._micro_batches([3, 5], 2, 1)
    assert [list(i) for i in mine] == [[3, 4, 5], [6, 7]]
    assert [list(i) for i in whole] == [[0, 1, 3, 4, 5], [2, 6, 7]]
