"""Credentials out of what the harness records: a command line or address kept in a report, launch.json or a
log line must not keep a token (issue 16: the report keeps the full command line, so
`--ray-address https://user:TOKEN@head:8265` would be published with the nightly HTML).

A leaf module (no harness imports) so the report collector, the launcher and the CLI can all use it.
"""
from __future__ import annotations

import re

_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:token|access_token|auth|key|password|secret|sig|signature)=)[^&#\s]+")


def redact_url(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by `***`: user:password@ and token-like query
    parameters (a command line kept in a report must not keep a token: issue 16)."""
    text = _CREDENTIALS.sub(lambda m: f"{m.group('scheme')}***@", text)
    return _SECRET_QUERY.sub(lambda m: f"{m.group(1)}***", text)


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with URL credentials redacted in every word (see redact_url)."""
    return [redact_url(word) for word in argv]
