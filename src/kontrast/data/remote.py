"""Files at a URL (``s3://``, ``gs://``, ``https://``): their sizes and byte ranges, with retries, errors in one line.

The file systems are fsspec's (https://filesystem-spec.readthedocs.io): its own HTTP(S) one (on ``aiohttp``),
``s3fs`` for S3 and any store with S3's API (MinIO, R2, Ceph: ``AWS_ENDPOINT_URL``), ``gcsfs`` for Google Cloud
Storage. Each is an optional package, named in a one-line error with its pip command when missing (``pip install
"kontrast[s3]"``). Credentials and endpoints come from where those packages look (the AWS variables and
``~/.aws``, Google's application-default credentials), and any other option of a file system from fsspec's own
variables (``FSSPEC_S3='{"anon": true}'``; https://filesystem-spec.readthedocs.io/en/latest/features.html#configuration).

Every call goes through :func:`_gathered`: the requests of one call run concurrently on fsspec's event loop;
a request that fails for a reason that may pass (a dropped connection, a timeout, a 5xx or 429 answer, fewer
bytes than asked) is tried again, :data:`ATTEMPTS` times in all with a doubling pause, then named in one
:class:`~kontrast.errors.UserError` with its URL; a missing file, a refusal (401/403, bad or absent credentials)
or any other answer is not retried and is named at once, a refusal with what to set.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import time
from collections.abc import Callable, Sequence

from kontrast.errors import UserError

# scheme -> (the package that reads it, the kontrast extra that installs it)
SCHEMES = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"), "http": ("aiohttp", "http"),
           "https": ("aiohttp", "http")}
CREDENTIALS = {  # what to set when a store refuses a read
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for an account that may read it, "
          "and AWS_ENDPOINT_URL for a store other than AWS",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file (or run `gcloud auth "
          "application-default login`) for an account that may read it",
    "http": "pass a URL that needs no login, or send one as a header with "
            "FSSPEC_HTTPS='{\"client_kwargs\": {\"headers\": {\"Authorization\": \"Bearer TOKEN\"}}}'",
}
ATTEMPTS = 4  # tries of a request that failed for a reason that may pass
BACKOFF = 0.5  # seconds before the second try, doubling: 0.5 + 1 + 2 s of waiting in all
CONCURRENT = 16  # requests of one call in flight at once
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                      "ExpiredToken", "RefreshError", "DefaultCredentialsError")
# the base classes of failures on the way (a reset, a refused connection, a timeout, a cut body), where installed
_NETWORK_ERRORS = {"aiohttp": ("ClientError",), "botocore.exceptions": ("HTTPClientError", "ResponseStreamingError"),
                   "fsspec.exceptions": ("FSTimeoutError",), "google.auth.exceptions": ("TransportError",)}


class Unreachable(str):
    """Why a sample could not be read when the storage failed, not the image (a str: what :meth:`read` of a stream
    source returns). A run stops on it, never replaces the sample under ``skip_bad_images``: resume when the
    storage answers again."""


def is_url(spec: str) -> bool:
    """``scheme://...``: a remote source (any scheme; :func:`scheme_of` refuses those kontrast cannot read)."""
    return bool(_URL.match(str(spec)))


def scheme_of(url: str) -> str:
    """The URL's scheme (``"s3"``, ``"https"``, ...), or a UserError naming the schemes kontrast reads."""
    match = _URL.match(url)
    scheme = match.group(1).lower() if match else ""
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise UserError(f"unknown scheme {scheme}:// in {url}; kontrast reads shards from {known} (or a local path)")
    return scheme


def filesystem(url: str):
    """``(fsspec file system, its path for url)``; a UserError with the pip command when its package is missing."""
    scheme = scheme_of(url)
    package, extra = SCHEMES[scheme]
    try:
        from fsspec.core import url_to_fs

        return url_to_fs(url)
    except ImportError as exc:
        raise UserError(f"reading {scheme}:// needs the {package} package: pip install \"kontrast[{extra}]\"") from exc


def stat_files(urls: Sequence[str]) -> list[dict | None]:
    """``{"size", "stamp"}`` of each URL (``stamp``: its ETag, generation or Last-Modified, "" if the store gives
    none), None where it does not exist. One request per URL, concurrently."""
    if not urls:
        return []
    fs, _ = filesystem(urls[0])
    infos = _gathered(fs, [(u, fs._strip_protocol(u), None) for u in urls], lambda path, _: fs._info(path),
                      missing_ok=True)
    for url, info in zip(urls, infos):
        if info is not None and info.get("size") is None:
            raise UserError(f"the server of {url} does not say its size (no Content-Length); serve the shards with "
                            "one that does (nginx, caddy, an object store)")
    return [None if info is None else {"size": int(info["size"]), "stamp": _stamp(info)} for info in infos]


def read_file(url: str) -> bytes | None:
    """The whole file at ``url``, or None when it does not exist."""
    fs, path = filesystem(url)
    return _gathered(fs, [(url, path, None)], lambda p, _: fs._cat_file(p), missing_ok=True)[0]


def read_ranges(url: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes ``[start, end)`` of each range of the file at ``url`` (one request each, concurrently)."""
    fs, path = filesystem(url)
    return _gathered(fs, [(url, path, r) for r in ranges], lambda p, r: fs._cat_file(p, start=r[0], end=r[1]))


def _stamp(info: dict) -> str:
    """What changes when the object does: S3's ETag, GCS's generation, HTTP's ETag or Last-Modified."""
    for key in ("ETag", "etag", "generation", "md5Hash", "Last-Modified", "LastModified", "mtime"):
        if info.get(key):
            return str(info[key])
    return ""


def _gathered(fs, calls: list[tuple[str, str, tuple | None]], request: Callable, missing_ok: bool = False) -> list:
    """``request(path, arg)`` for each ``(url, path, arg)`` of ``calls`` on fsspec's loop, concurrently; each failed
    one that may pass retried (see the module doc). A range's answer must be its length, or it is retried too."""
    from fsspec.asyn import sync

    results: list = [None] * len(calls)
    todo, last = list(range(len(calls))), {}
    for attempt in range(ATTEMPTS):
        if attempt:
            time.sleep(BACKOFF * 2 ** (attempt - 1))
        answers = sync(fs.loop, _concurrently, [lambda c=calls[k]: request(c[1], c[2]) for k in todo])
        failed = []
        for k, answer in zip(todo, answers):
            url, _, arg = calls[k]
            if isinstance(answer, BaseException):
                kind = failure_kind(answer)
                if kind == "missing" and missing_ok:
                    continue
                if kind != "transient":
                    raise failure_error(answer, url, kind)
                failed.append(k)
                last[k] = _reason(answer)
            elif arg is not None and len(answer) > arg[1] - arg[0]:
                raise UserError(f"the server of {url} ignores HTTP Range requests (it sent {len(answer)} bytes for "
                                f"bytes {arg[0]}-{arg[1] - 1}); serve the shards with one that honours them (nginx, "
                                "caddy, an object store)")
            elif arg is not None and len(answer) < arg[1] - arg[0]:  # cut short: may pass
                failed.append(k)
                last[k] = f"{len(answer)} bytes where {arg[1] - arg[0]} were asked for (bytes {arg[0]}-{arg[1] - 1})"
            else:
                results[k] = answer
        if not failed:
            return results
        todo = failed
    k = todo[0]
    raise UserError(f"cannot read {calls[k][0]}: {last[k]} (tried {ATTEMPTS} times); check the network and the "
                    "address, then run again (--resume continues a stopped run)")


async def _concurrently(factories: list[Callable]) -> list:
    """Each coroutine of ``factories`` run, at most :data:`CONCURRENT` at once; results or exceptions, in order."""
    gate = asyncio.Semaphore(CONCURRENT)

    async def one(factory):
        async with gate:
            return await factory()

    return await asyncio.gather(*(one(f) for f in factories), return_exceptions=True)


def failure_kind(exc: BaseException) -> str:
    """``"missing"``, ``"denied"`` (401/403, bad or absent credentials), ``"transient"`` (may pass: retry) or
    ``"other"``, from the exception and its causes (fsspec's HTTP wraps every failure of a HEAD in
    FileNotFoundError, s3fs a refusal in PermissionError with botocore's error as its cause)."""
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for e in chain:
        status = _status(e)
        if status is not None:
            return ("missing" if status in (404, 410) else "denied" if status in (401, 403) else
                    "transient" if status >= 500 or status in (408, 429) else "other")
        if isinstance(e, PermissionError) or type(e).__name__ in _CREDENTIAL_ERRORS:
            return "denied"
    if any(isinstance(e, _network_errors()) for e in chain):
        return "transient"
    return "missing" if any(isinstance(e, FileNotFoundError) for e in chain) else "other"


def _network_errors() -> tuple[type, ...]:
    """Failures on the way, of the standard library and of the file systems' packages that are installed."""
    kinds = [ConnectionError, TimeoutError, asyncio.TimeoutError]
    for module, names in _NETWORK_ERRORS.items():
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        kinds += [getattr(found, name) for name in names if hasattr(found, name)]
    return tuple(kinds)


def _status(exc: BaseException) -> int | None:
    """The HTTP status of an answer an exception carries: aiohttp's ``.status``, botocore's response, gcsfs's
    ``HttpError.code`` (not aiohttp's parser errors' ``.code``: a cut body is not a 400 answer)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status else None
    value = getattr(exc, "code" if type(exc).__name__ == "HttpError" else "status", None)
    return value if isinstance(value, int) and 100 <= value < 600 else None


def failure_error(exc: BaseException, url: str, kind: str | None = None) -> UserError:
    """The one line for a failure that is not retried: a missing file, a refusal (with what to set), or other."""
    kind = kind or failure_kind(exc)
    if kind == "missing":
        return UserError(f"not found: {url}")
    if kind == "denied":
        scheme = scheme_of(url)
        where = re.sub(r"^[^:]+://([^/]*).*$", rf"{scheme}://\1", url)
        advice = CREDENTIALS["gs" if scheme == "gcs" else "http" if scheme == "https" else scheme]
        return UserError(f"access denied to {where} ({_refusal(exc)}) reading {url}: {advice}")
    return UserError(f"cannot read {url}: {_reason(exc)}")


def _refusal(exc: BaseException) -> str:
    """A refusal in a few words: the store's error code (``InvalidAccessKeyId``, ``AccessDenied``), the HTTP
    status, or the credentials error."""
    for e in (exc, exc.__cause__ or exc.__context__):
        response = getattr(e, "response", None)
        code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
        if code:
            return str(code)
        if e is not None and _status(e):
            return f"HTTP {_status(e)}"
        if e is not None and type(e).__name__ in _CREDENTIAL_ERRORS:
            return _reason(e)
    return _reason(exc)


def _reason(exc: BaseException) -> str:
    """An exception in a few words on one line: its type and the first line of its message (causes looked into
    when the message is empty or only the URL)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    cause = exc.__cause__ or exc.__context__
    if cause is not None and (not text or "://" in text or text.startswith("/")):
        return _reason(cause)
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
