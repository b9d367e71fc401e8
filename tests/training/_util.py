"""Shared helpers for the training tests.

Stable API:
    MLP(): a 2-layer perceptron (lazy first layer) for 4 features, 3 classes.
    make_data(n=24, seed=0): a TupleDataset of float32 (4,) inputs and
        int32 labels in [0, 3).
    make_trainer(out, stop=(3, 'epoch'), batch_size=5, seed=0, lr=0.1,
        extensions=()): a Trainer over a Classifier(MLP) with MomentumSGD,
        a shuffled SerialIterator (iterator seed 7), fixed initial weights.
    FakeTrainer(iteration=0, epoch_detail=0.0, previous=None): an object
        with ``updater.iteration / epoch / epoch_detail /
        previous_epoch_detail`` and ``observation``, for testing triggers.
"""
import types

import numpy

import minichain
from minichain import datasets, iterators, optimizers, training
from minichain import functions as F
from minichain import links as L


class MLP(minichain.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, 6)
            self.l2 = L.Linear(6, 3)

    def forward(self, x):
        return self.l2(F.tanh(self.l1(x)))


def make_data(n=24, seed=0):
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype(numpy.float32)
    t = (numpy.abs(x[:, 0] * 1.5).astype(numpy.int32)).clip(0, 2)
    return datasets.TupleDataset(x, t.astype(numpy.int32))


def make_model(seed=0):
    model = L.Classifier(MLP())
    rng = numpy.random.default_rng(seed)
    model(numpy.zeros((1, 4), numpy.float32),
          numpy.zeros(1, numpy.int32))  # initialize the lazy layer
    for param in model.params():
        param.array[...] = rng.standard_normal(param.shape) * 0.5
    return model


def make_trainer(out, stop=(3, 'epoch'), batch_size=5, seed=0, lr=0.1,
                 extensions=(), data=None):
    model = make_model(seed)
    optimizer = optimizers.MomentumSGD(lr=lr).setup(model)
    data = make_data() if data is None else data
    it = iterators.SerialIterator(data, batch_size, seed=7)
    updater = training.StandardUpdater(it, optimizer)
    trainer = training.Trainer(updater, stop, out=str(out))
    for ext in extensions:
        trainer.extend(ext)
    return trainer


class FakeTrainer:
    def __init__(self, iteration=0, epoch_detail=0.0, previous=None):
        self.updater = types.SimpleNamespace(
            iteration=iteration, epoch=int(epoch_detail),
            epoch_detail=epoch_detail, previous_epoch_detail=previous)
        self.observation = {}

    def step(self, iteration, epoch_detail, previous):
        self.updater.iteration = iteration
        self.updater.epoch = int(epoch_detail)
        self.updater.epoch_detail = epoch_detail
        self.updater.previous_epoch_detail = previous
