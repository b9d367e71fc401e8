"""``join``: ranks whose shards differ in length finish an epoch together,
on the multi-node optimizer (:mod:`minichain.dist.optimizers`)."""
import contextlib

from minichain.dist.averaging.base import Averaging, Wrapper


class Join(Wrapper):
    """The optimizer's averaging inside ``join``: after backward (never
    during: a rank without data has no backward to hook), each rank saying
    whether it still has data (``has_data``).

    Attributes:
        has_data: whether this rank still has data.
        ranks_with_data: how many ranks had data at the last averaging.
    """

    def __init__(self, inner):
        super().__init__(inner)
        self.has_data = True
        self.ranks_with_data = None

    def prepare(self, final=True):
        self.inner.prepare(False)

    def average(self, model, has_data=None):
        n = self.inner.average(model, self.has_data)
        if self.inner.starts_step:  # averaged (not a pass to accumulate)
            self.ranks_with_data = n
        return n


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
    averaging = getattr(optimizer, 'averaging', None)
    if not isinstance(averaging, Averaging) or not averaging.can_join:
        raise TypeError('join: expected a multi-node optimizer without double '
                        'buffering or shard_state, got {}{}'.format(
                            type(optimizer).__name__, '' if averaging is None
                            else ' with double buffering or shard_state'))
    if optimizer.needs_broadcast:  # every rank is here: broadcast now
        optimizer.update()
    joined = optimizer.averaging = Join(averaging)
    joined.prepare()  # no overlap inside: it averages after backward
    try:
        yield optimizer
        # Out of data: shadow the others' updates, contributing zeros, until
        # no rank has data.
        joined.has_data = False
        target = optimizer.target
        while joined.ranks_with_data != 0:
            target.cleargrads()
            optimizer.update()
    finally:
        optimizer.averaging = averaging
        averaging.prepare()
