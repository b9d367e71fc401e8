"""models/train_extensions.py: the progress line of train_resnet50.py."""
import types

import numpy

from models.train_extensions import Progress


def _trainer(iteration, loss, acc):
    updater = types.SimpleNamespace(iteration=iteration, epoch_detail=0.5,
                                    images_per_update=64, recent=[0.5, 1.5])
    return types.SimpleNamespace(
        updater=updater,
        observation={'main/loss': numpy.float32(loss),
                     'main/accuracy': numpy.asarray(acc, numpy.float32)})


def test_line_every_interval_with_smoothed_values(capsys):
    p = Progress(total=20, interval=2)
    p._tqdm = None  # the plain-text path
    p(_trainer(1, 2.0, 0.5))
    assert capsys.readouterr().out == ''  # not an interval: nothing read
    p(_trainer(2, 1.0, 1.0))
    # exponential smoothing: 0.9 * 2.0 + 0.1 * 1.0, 0.9 * 0.5 + 0.1 * 1.0;
    # 64 images x 2 updates in 2.0 s
    assert capsys.readouterr().out == (
        'iteration 2/20 epoch 0.50 loss 1.900 acc 0.550 64.0 img/s\n')


def test_smoothed_values_stay_arrays_until_printed():
    # On the GPU a float() of a device scalar waits for the device: the
    # smoothing must keep array values and convert only for the text.
    p = Progress(total=20, interval=10)
    p._tqdm = None
    p(_trainer(1, 2.0, 0.5))
    p(_trainer(2, 1.0, 1.0))
    assert all(isinstance(v, (numpy.ndarray, numpy.generic))
               for v in p.smooth.values())
