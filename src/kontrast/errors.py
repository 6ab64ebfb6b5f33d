"""The one exception type for mistakes a user can fix (bad path, bad key, ...).

The CLI prints ``error: <message>`` on one line and exits with code 2.
"""


class UserError(Exception):
    """A problem with the user's input; the message says what is wrong and what to do."""


class Refusal(UserError):
    """A UserError about a setting, carrying the settings its message advises: ``advice`` maps ``section.key``
    (or ``nproc``) to the value to set, so a caller (or a test) can apply it and try again."""

    def __init__(self, message: str, advice: dict):
        super().__init__(message)
        self.advice = dict(advice)


class Interrupted(Exception):
    """Training stopped on SIGTERM / SIGINT after writing a checkpoint; the CLI exits with ``exit_code``
    (128 + the signal number: 143 for SIGTERM, 130 for SIGINT), or stopped because another process of a
    distributed run was lost (``peer_lost``, exit code 1)."""

    def __init__(self, message: str, exit_code: int, peer_lost: bool = False):
        super().__init__(message)
        self.exit_code = exit_code
        self.peer_lost = peer_lost


def did_you_mean(name: str, known) -> str:
    """``" (did you mean 'simclr'?)"`` for the closest of ``known`` to a mistyped ``name``; ``""`` if none is close."""
    import difflib

    known = [str(k) for k in known]
    same_but_case = [k for k in known if k.lower() == str(name).lower()]  # 'SimCLR' -> 'simclr'
    close = same_but_case or difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
    if not close:  # a case-blind second look: 'MoCo_V2' -> 'moco_v2'
        lowered = {k.lower(): k for k in known}
        close = [lowered[m] for m in difflib.get_close_matches(str(name).lower(), list(lowered), n=1, cutoff=0.6)]
    return f" (did you mean {close[0]!r}?)" if close else ""
