"""DumpGraph: write the computational graph of the loss once, as Chainer's."""
import os

from minichain import graph as graph_module
from minichain.training import extension
from minichain.variable import Variable

__all__ = ['DumpGraph']


class _DotText(graph_module.ComputationalGraph):
    """A graph already turned into DOT text, so that ``render`` writes it
    as it was, without holding the nodes (and their arrays) alive."""

    def __init__(self, text):  # no super(): there are no nodes to keep
        self.text = text
        self.nodes = self.edges = ()

    def dump(self, format='dot'):
        """The stored DOT text."""
        return self.text


class DumpGraph(extension.Extension):
    """Write the graph behind the reported value ``root_name`` to a file.

    The engine frees the graph during ``backward`` (each node drops its
    inputs once it ran), and a Trainer calls extensions after the update,
    so the graph cannot be read from ``trainer.observation`` afterwards (it
    holds arrays anyway). Instead, ``initialize`` hooks the trainer's
    reporter: the first time ``root_name`` is reported as a Variable (as
    ``L.Classifier`` reports its loss, before the optimizer runs backward),
    the graph is turned into DOT text there and then, and the hook is
    removed. When the extension's trigger first fires, the text is written
    to ``trainer.out/filename`` (atomically), with a PNG beside it when
    Graphviz's ``dot`` is installed (see :func:`minichain.graph.render`).
    Later calls do nothing. In a data-parallel run, extend only rank 0's
    trainer with it.

    Args:
        root_name: the observation key of the graph's output, e.g.
            ``'main/loss'``.
        filename: the DOT file's name inside ``trainer.out``.
        variable_style, function_style: extra DOT attributes for variable
            and function nodes (see ``build_computational_graph``).

    Raises (when the trigger first fires):
        KeyError: ``root_name`` was never reported.
        TypeError: it was reported, but not as a Variable.
    """

    trigger = (1, 'iteration')
    priority = extension.PRIORITY_READER

    def __init__(self, root_name='main/loss', filename='cg.dot',
                 variable_style=None, function_style=None):
        self.root_name = root_name
        self.filename = filename
        self.variable_style = variable_style
        self.function_style = function_style
        self._reporter = None
        self._text = None
        self._seen = None  # the type of what was reported as root_name
        self._written = False

    def initialize(self, trainer):
        """Hook the trainer's reporter (unless the graph was written)."""
        if not self._written and self._text is None:
            self._reporter = trainer.reporter
            # An instance attribute shadows Reporter.report for this
            # reporter only; finalize (or the capture) deletes it.
            self._reporter.report = self._report

    def _report(self, values, observer=None):
        reporter = self._reporter
        type(reporter).report(reporter, values, observer)
        # Learn the full key of each value by reporting the keys themselves
        # into a scratch observation (the same prefixing rule, no copy).
        saved, keys = reporter.observation, {}
        reporter.observation = keys
        try:
            type(reporter).report(reporter, {k: k for k in values}, observer)
        finally:
            reporter.observation = saved
        key = keys.get(self.root_name)
        if key is None:
            return
        value = values[key]
        self._seen = type(value)
        if isinstance(value, Variable):
            self._text = graph_module.build_computational_graph(
                value, variable_style=self.variable_style,
                function_style=self.function_style).dump()
        self._unhook()  # a value that is no Variable will not become one

    def _unhook(self):
        if self._reporter is not None:
            self._reporter.__dict__.pop('report', None)
            self._reporter = None

    def __call__(self, trainer):
        """Write the captured graph, the first time only.

        Returns:
            the list of paths written (``[dot]`` or ``[dot, png]``), or None
            when it was written before.
        """
        if self._written:
            return None
        if self._text is None:
            if self._seen is None:
                raise KeyError('DumpGraph: {!r} was never reported; the keys '
                               'reported this iteration are {}'.format(
                                   self.root_name, sorted(trainer.observation)))
            raise TypeError('DumpGraph: {!r} was reported as a {}, not a '
                            'Variable, so it has no graph'.format(
                                self.root_name, self._seen.__name__))
        paths = graph_module.render(_DotText(self._text),
                                    os.path.join(trainer.out, self.filename))
        self._written, self._text = True, None
        return paths

    def finalize(self):
        """Remove the reporter hook if the root was never captured."""
        self._unhook()
