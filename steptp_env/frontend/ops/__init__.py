"""Op handlers, one module per family; importing this package registers them all in `HANDLERS`."""
from . import elementwise, index, linalg, shape, nn, reduce, scan, loss  # noqa: F401
