import numpy
import pytest

import minichain
from minichain import iterators, optimizers, serializers, training
from minichain import links as L
from tests.training._util import make_data, make_model


class RecordingOptimizer(optimizers.SGD):
    def __init__(self):
        super().__init__(lr=0.0)
        self.calls = []

    def update(self, lossfun=None, *args, **kwds):
        self.calls.append((lossfun, args, kwds))


def _updater(batch_size=5, **kwargs):
    model = make_model()
    opt = optimizers.SGD(lr=0.1).setup(model)
    it = iterators.SerialIterator(make_data(), batch_size, shuffle=False)
    return training.StandardUpdater(it, opt, **kwargs), model, opt


def test_update_steps_the_model_and_counts():
    updater, model, opt = _updater()
    before = model.predictor.l1.W.array.copy()
    updater.update()
    assert updater.iteration == 1 and opt.t == 1
    assert not numpy.array_equal(before, model.predictor.l1.W.array)
    # the same step by hand
    ref = make_model()
    x, t = minichain.dataset.concat_examples(make_data()[:5])
    ref_opt = optimizers.SGD(lr=0.1).setup(ref)
    ref_opt.update(ref, x, t)
    numpy.testing.assert_array_equal(ref.predictor.l1.W.array,
                                     model.predictor.l1.W.array)


def test_epochs_follow_the_main_iterator():
    updater, _, opt = _updater(batch_size=10)
    assert updater.previous_epoch_detail is None
    for _ in range(3):
        updater.update()
    # 24 examples, batches of 10: the third batch crosses the epoch end
    assert updater.epoch == 1 and updater.is_new_epoch and opt.epoch == 1
    assert updater.epoch_detail == pytest.approx(30 / 24)
    assert updater.previous_epoch_detail == pytest.approx(20 / 24)


def test_batch_kinds_reach_the_loss_function():
    opt = RecordingOptimizer().setup(L.Linear(2, 2))
    data = [numpy.full(2, i, numpy.float32) for i in range(4)]
    it = iterators.SerialIterator(data, 2, shuffle=False)
    updater = training.StandardUpdater(it, opt, loss_func='loss')
    updater.update()
    lossfun, args, kwds = opt.calls[-1]
    assert lossfun == 'loss' and len(args) == 1 and args[0].shape == (2, 2)
    dicts = [{'a': numpy.zeros(1), 'b': numpy.ones(1)}] * 2
    updater = training.StandardUpdater(
        iterators.SerialIterator(dicts, 2), opt)
    updater.update()
    lossfun, args, kwds = opt.calls[-1]
    assert lossfun is opt.target and args == () and set(kwds) == {'a', 'b'}


def test_dicts_need_main_and_optimizers_need_setup():
    model = make_model()
    opt = optimizers.SGD().setup(model)
    it = iterators.SerialIterator(make_data(), 2)
    with pytest.raises(ValueError, match="'main' entry"):
        training.StandardUpdater({'train': it}, opt)
    updater = training.StandardUpdater({'main': it}, {'main': opt})
    assert updater.get_iterator() is it and updater.get_optimizer() is opt
    assert updater.get_all_optimizers() == {'main': opt}
    with pytest.raises(ValueError, match='call optimizer.setup'):
        training.StandardUpdater(it, optimizers.SGD())


def test_device_moves_the_model():
    updater, model, _ = _updater(device='@numpy')
    assert updater.device == minichain.get_device(-1)
    assert model.xp is numpy
    updater.update()


def test_serialize_uses_chainer_keys_and_round_trips(tmp_path):
    updater, model, _ = _updater()
    updater.update()
    updater.update()
    saver = serializers.DictionarySerializer()
    saver.save(updater)
    keys = set(saver.target)
    assert {'iteration', 'iterator:main/epoch', 'optimizer:main/t',
            'model:main/predictor/l1/W'} <= keys
    path = str(tmp_path / 'u.npz')
    serializers.save_npz(path, updater)
    fresh, fresh_model, fresh_opt = _updater()
    serializers.load_npz(path, fresh)
    assert fresh.iteration == 2 and fresh_opt.t == 2
    assert fresh.get_iterator().current_position == 10
    numpy.testing.assert_array_equal(fresh_model.predictor.l2.W.array,
                                     model.predictor.l2.W.array)
