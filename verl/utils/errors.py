"""The mark of an error the user can fix by changing what they gave: the config, a data file, a model.

The command-line entry points print such an error as one line, ``Error in the <kind>: <message>``,
instead of a traceback (:func:`verl.config.cli.user_errors_as_one_line`); code that calls the library
in-process gets the exception itself. The message names what to change (the key, the file and row,
the path).
"""

from __future__ import annotations


class UserInputError(Exception):
    """A mistake in the user's input; ``kind`` says which (config, data, model)."""

    kind = "input"
