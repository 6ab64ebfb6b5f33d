"""The one exception type for mistakes a user can fix (bad path, bad key, ...).

The CLI prints ``error: <message>`` on one line and exits with code 2.
"""


class UserError(Exception):
    """A problem with the user's input; the message says what is wrong and what to do."""
