"""minichain.iterators: iterators that turn a dataset into batches."""
from minichain.iterators.serial_iterator import SerialIterator  # noqa: F401
from minichain.iterators.multiprocess_iterator import (  # noqa: F401
    MultiprocessIterator)
