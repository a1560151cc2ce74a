"""``python -m eventlake.cli``: the ``eventlake`` command."""
from eventlake.cli import entry

entry()
