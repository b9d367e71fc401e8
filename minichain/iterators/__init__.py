"""minichain.iterators: iterators that turn a dataset into batches."""
from minichain.iterators.serial_iterator import SerialIterator  # noqa: F401
