"""``join``: ranks whose shards differ in length finish an epoch together,
on the multi-node optimizer (:mod:`minichain.dist.optimizers`)."""
import contextlib

from minichain.dist.optimizers import (_DoubleBufferingOptimizer,
                                       _MultiNodeOptimizer)


@contextlib.contextmanager
def join(optimizer):
    """Let ranks whose shards differ in length finish an epoch together.

    Synchronous training needs every rank to call ``update`` equally often;
    with shards of different lengths (``scatter_dataset(...,
    force_equal_length=False)``, or data read per rank) the rank that runs
    out first would leave the others waiting. Inside ``join`` (DDP's
    ``Join`` is the model), a rank that leaves the block keeps taking part
    in the others' updates, contributing no gradient, until every rank has
    left; each update's gradient is then the mean over the ranks that still
    had data, and every rank applies it, so the models stay equal::

        with dist.join(opt):
            for x, t in my_batches:       # as many as this rank has
                opt.update(lossfun, x, t)

    Collective: every rank enters and leaves. Each update inside costs one
    count of the ranks with data once some rank has run out (none before).
    Other collectives in the loop body are not shadowed, so a model with
    ``MultiNodeBatchNormalization`` cannot join (the ranks then raise a
    CollectiveMismatchError). On an exception inside the block the rank
    does not shadow (the job ends as for any error).

    Args:
        optimizer: a multi-node optimizer (``create_multi_node_optimizer``,
            without double buffering).
    Yields:
        the optimizer.
    """
    if not isinstance(optimizer, _MultiNodeOptimizer) or isinstance(
            optimizer, _DoubleBufferingOptimizer):
        raise TypeError('join: expected a multi-node optimizer without double '
                        'buffering, got {}'.format(type(optimizer).__name__))
    if optimizer.needs_broadcast:  # every rank is here: broadcast now
        optimizer.update()
    optimizer._active = True
    optimizer._arm()  # no overlap inside: it averages after backward
    try:
        yield optimizer
        optimizer._active = False
        target = optimizer.actual_optimizer.target
        while True:
            target.cleargrads()
            if not optimizer._average_and_step(target):
                break
    finally:
        optimizer._active = None
        optimizer._arm()
