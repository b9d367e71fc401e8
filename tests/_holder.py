"""A link that holds given arrays as parameters, for optimizer tests."""
import numpy

import minichain


class Holder(minichain.Link):
    """``Holder(w=[1.0, 2.0], b=...)``: one Parameter per keyword."""

    def __init__(self, **arrays):
        super().__init__()
        with self.init_scope():
            for name, a in arrays.items():
                setattr(self, name, minichain.Parameter(numpy.array(a)))
