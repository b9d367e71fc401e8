"""observe_value and observe_lr: report a value computed from the trainer."""
from minichain import reporter
from minichain.training import extension

__all__ = ['observe_value', 'observe_lr']


def observe_value(observation_key, target_func):
    """An extension reporting ``{observation_key: target_func(trainer)}``
    (every epoch by default; priority WRITER, so LogReport sees it).

    Args:
        observation_key: the key in the observation.
        target_func: ``target_func(trainer)`` -> a scalar.
    """
    @extension.make_extension(trigger=(1, 'epoch'),
                              default_name='observe_' + observation_key,
                              priority=extension.PRIORITY_WRITER)
    def _observe(trainer):
        reporter.report({observation_key: target_func(trainer)})
    return _observe


def observe_lr(optimizer_name='main', observation_key='lr'):
    """An extension reporting the learning rate ``optimizer.lr`` of the
    updater's optimizer ``optimizer_name`` as ``observation_key``."""
    return observe_value(
        observation_key,
        lambda trainer: trainer.updater.get_optimizer(optimizer_name).lr)
