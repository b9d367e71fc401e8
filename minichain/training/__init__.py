"""minichain.training: the Trainer, updaters, triggers and extensions.

A training script in Chainer's shape::

    updater = training.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (20, 'epoch'), out='result')
    trainer.extend(extensions.Evaluator(test_iter, model))
    trainer.extend(extensions.LogReport())
    trainer.run()
"""
from minichain.training import extension  # noqa: F401
from minichain.training import extensions, triggers, updaters  # noqa: F401
from minichain.training import util  # noqa: F401  (chainer.training.util)
from minichain.training.extension import (Extension,  # noqa: F401
                                          make_extension)
from minichain.training.trainer import Trainer  # noqa: F401
from minichain.training.triggers import get_trigger  # noqa: F401
from minichain.training.updater import Updater  # noqa: F401
from minichain.training.updaters import StandardUpdater  # noqa: F401
