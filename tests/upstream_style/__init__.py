"""Scripts written the way Chainer's and ChainerMN's examples are written,
against minichain: only their import lines name minichain.

* ``train_mnist.py``: a single-process trainer in the shape of Chainer's
  ``examples/mnist/train_mnist.py`` (``call_before_training``,
  ``snapshot(n_retains=..., autoload=...)``, PlotReport, ``--resume``);
* ``train_mnist_data_parallel.py``: the shape of ChainerMN's
  ``examples/chainermn/mnist/train_mnist.py`` (``import chainerx``,
  ``get_mnist`` on rank 0, ``load_npz(resume, trainer)`` on every rank);
* ``resnet50.py``: the shape of ChainerMN's ImageNet ``models/resnet50.py``
  (a ChainList of bottlenecks, ``chainer.report`` in ``__call__``).

tests/test_upstream_style.py runs them.
"""
