"""L.Classifier: a predictor plus a loss, reporting loss and accuracy."""
from minichain import functions as F
from minichain import reporter
from minichain.link import Chain
from minichain.links import _mixed16

__all__ = ['Classifier']


class Classifier(Chain):
    """Wraps a predictor into a link that returns the loss.

    ``model(x, t)`` computes ``y = predictor(x)``, ``loss = lossfun(y, t)``
    and, if ``compute_accuracy``, ``accuracy = accfun(y, t)``; it reports
    ``{'loss': loss, 'accuracy': accuracy}`` with itself as the observer
    (``'main/loss'`` in a Trainer) and returns ``loss``.

    Args:
        predictor: the link (or callable) computing ``y``.
        lossfun: ``lossfun(y, t)`` -> scalar Variable.
        accfun: ``accfun(y, t)`` -> scalar Variable.
        label_key: which argument is the label: an int position (``-1``:
            the last positional argument) or a keyword name.

    Attributes:
        y, loss, accuracy: the results of the last call.
        compute_accuracy: set False to skip the accuracy.
    """

    def __init__(self, predictor, lossfun=F.softmax_cross_entropy,
                 accfun=F.accuracy, label_key=-1):
        if not isinstance(label_key, (int, str)) or isinstance(label_key,
                                                               bool):
            raise TypeError('Classifier: label_key must be an int or a str, '
                            'got {}'.format(type(label_key).__name__))
        super().__init__()
        self.lossfun = lossfun
        self.accfun = accfun
        self.label_key = label_key
        self.compute_accuracy = True
        self.y = self.loss = self.accuracy = None
        with self.init_scope():
            self.predictor = predictor

    def forward(self, *args, **kwargs):
        """Return the loss of ``predictor(*inputs)`` against the label."""
        args = list(args)
        if isinstance(self.label_key, int):
            if not -len(args) <= self.label_key < len(args):
                raise ValueError('Classifier: label_key {} is out of range '
                                 'for {} positional arguments'.format(
                                     self.label_key, len(args)))
            t = args.pop(self.label_key)
        else:
            if self.label_key not in kwargs:
                raise ValueError('Classifier: keyword argument {!r} (the '
                                 'label) is missing'.format(self.label_key))
            t = kwargs.pop(self.label_key)
        self.y = self.loss = self.accuracy = None
        self.y = self.predictor(*args, **kwargs)
        if _mixed16.on():    # the loss in float32 (links/_mixed16.py)
            self.y = F.cast(self.y, 'float32')
        self.loss = self.lossfun(self.y, t)
        reporter.report({'loss': self.loss}, self)
        if self.compute_accuracy:
            self.accuracy = self.accfun(self.y, t)
            reporter.report({'accuracy': self.accuracy}, self)
        return self.loss
