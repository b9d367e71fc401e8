"""Ways to average gradients under the multi-node optimizer.

* :mod:`~minichain.dist.averaging.overlap` -- buckets allreduced while
  backward runs (and the double-buffered variant).
* :mod:`~minichain.dist.averaging.join` -- ``dist.join``: ranks whose
  shards differ in length finish an epoch together.

Start with ``optimizers.py``: after backward, average, then step.
"""
