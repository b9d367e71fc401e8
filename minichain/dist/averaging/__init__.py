"""Ways to average gradients under the multi-node optimizer.

Start with ``optimizers.py`` (after backward, average, then step), then
:mod:`~minichain.dist.averaging.base`: the interface it calls.

* :mod:`~minichain.dist.averaging.after_backward` -- the plain averaging:
  the communicator's ``multi_node_mean_grad`` after backward.
* :mod:`~minichain.dist.averaging.overlap` -- buckets allreduced while
  backward runs.
* :mod:`~minichain.dist.averaging.double_buffered` -- each step's gradients
  averaged during the next step (GPU, NCCL).
* :mod:`~minichain.dist.averaging.sharded` -- ``shard_state``: the
  gradients reduce-scattered, each rank steps its 1/N of the parameters
  with 1/N of the optimizer state, the parameters allgathered.

Wrappers around any of them:

* :mod:`~minichain.dist.averaging.accumulate` -- k backward passes per step.
* :mod:`~minichain.dist.averaging.finite` -- no step on inf or NaN.
* :mod:`~minichain.dist.averaging.join` -- ``dist.join``: ranks whose
  shards differ in length finish an epoch together.
"""
