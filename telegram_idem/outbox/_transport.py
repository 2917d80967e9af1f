"""The Bot API transport: one HTTP request per call, and an honest account of what
happened when no answer came.

:class:`BotAPI` is what the relay needs; :class:`HttpBotAPI` is the aiohttp one (extra
``telegram-idem[outbox]``). A request is ``POST {base_url}/bot{token}/{method}`` (Bot API
"Making requests"): a JSON body, or ``multipart/form-data`` when the stored params name a
local file (``{"telegram_idem_file": path}``, see
:class:`~telegram_idem.outbox._calls.FileRef`; Bot API "Sending files": a top-level
file parameter is a form part, a file inside a structure such as ``InputMedia`` is a part
named by ``attach://<name>``).

What comes back:

- an answer, 2xx, 4xx or 5xx alike: an :class:`~telegram_idem.outbox._calls.Answer`
  (``classify`` makes a 5xx ambiguous);
- :class:`~telegram_idem.outbox._failures.CallNotSent`: the request never left (connection
  refused, DNS, a connect timeout, a local file that cannot be read);
- :class:`~telegram_idem.outbox._failures.AmbiguousCall`: anything else (a timeout after
  the connection was made, the connection broke, a 2xx body that is not JSON): the
  request may have been applied. When in doubt, ambiguous.

The bot token is a credential: it is in the request URL and nowhere else. No log line,
exception message, ``repr`` or stored entry carries it (exceptions are raised without a cause or
context, with the token masked in their text: aiohttp's own messages name the URL).
:meth:`HttpBotAPI.carries_token` is how :class:`~telegram_idem.outbox.Outbound` refuses
params that hold the token (a file download URL) before it stores them, and
:meth:`HttpBotAPI.redact` masks Telegram's descriptions before they are recorded.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self
from urllib.parse import unquote, urlsplit

from telegram_idem.outbox._calls import FILE_FIELD, Answer
from telegram_idem.outbox._failures import AmbiguousCall, CallNotSent

if TYPE_CHECKING:
    import aiohttp

__all__ = ["BotAPI", "HttpBotAPI", "bot_id_of_token"]

log = logging.getLogger("telegram_idem.outbox")

_MASK = "<token>"

_SECRET_MIN = 16
"""The shortest secret (the part of a token after ``:``) that is looked for on its own:
a real one has 35 characters; a shorter one (a test's ``"1:x"``) is only looked for
whole, so ``"x"`` in a text is no false positive."""

_DECODINGS = 4
"""How many rounds of percent-decoding :meth:`HttpBotAPI.carries_token` looks through
(``%3A``, ``%253A``, ...)."""

TOKEN_IN_PARAMS = (
    "the params carry the bot token, and a stored call must not: if it is a Bot API file "
    "download URL (https://api.telegram.org/file/bot<token>/<file_path>), send the "
    "file's file_id instead, since a download URL carries the bot token; anywhere else "
    "(a text, a caption), leave it out. Nothing was stored"
)
"""The text of the ``ValueError`` for a durable call whose params hold the token."""


class BotAPI(Protocol):
    """Sends one Bot API call and returns its answer.

    A transport may also have ``async def warm(self) -> None``: the relay awaits it once
    before its first flood reservation, so set-up the first calls would otherwise pay
    between their reservation and their request (imports, a session) is paid before
    (:meth:`HttpBotAPI.warm`).
    """

    async def call(self, method: str, params: bytes) -> Answer:
        """Send ``method`` with ``params`` once.

        Args:
            method: the Bot API method (``"sendMessage"``).
            params: the stored params: a JSON object as bytes, files by reference
                (``{"telegram_idem_file": path}``).

        Returns:
            Telegram's answer, whatever its status (classify it).

        Raises:
            CallNotSent: the request never left: safe to send again.
            AmbiguousCall: it may have been applied; no answer came.
        """
        ...


def bot_id_of_token(token: str) -> int:
    """The bot's id: the number before ``:`` in its token (Bot API "Authorizing your bot":
    tokens look like ``123456:ABC-DEF...``).

    Raises:
        ValueError: the token does not have that shape (the message does not show it).
    """
    head, sep, tail = token.partition(":")
    if not sep or not tail or not head.isdigit():
        raise ValueError("a bot token looks like '<bot_id>:<secret>'; this one does not")
    return int(head)


class HttpBotAPI:
    """The Bot API over HTTP with aiohttp (extra ``telegram-idem[outbox]``).

    Args:
        token: the bot token (kept private: see the module docstring).
        base_url: the Bot API server (a local ``telegram-bot-api``, a test fake).
        timeout: seconds one call may take, connecting included.
        session: an aiohttp session to use (its owner closes it); by default one is
            made at the first call and closed by :meth:`close`.

    Raises:
        ValueError: ``timeout`` is not > 0, or ``base_url`` is not an ``http://`` or
            ``https://`` URL with a host.
    """

    def __init__(
        self,
        token: str,
        *,
        base_url: str = "https://api.telegram.org",
        timeout: float = 30.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError("timeout must be > 0 seconds")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"base_url must be an http:// or https:// URL with a host, got {base_url!r}"
            )
        self.__token = token
        head, sep, secret = token.partition(":")
        self.__needles = tuple(
            n for n in {token, secret if sep and len(secret) >= _SECRET_MIN else ""} if n
        )
        forms = [re.escape(token)] if token else []
        if sep and secret:
            # the ':' percent-encoded once or twice (a URL inside a URL)
            forms.append(f"{re.escape(head)}%(?:25)*3[aA]{re.escape(secret)}")
        if len(self.__needles) > 1:
            forms.append(re.escape(secret))
        self.__pattern = re.compile("|".join(forms)) if forms else None
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session = session
        self._owns_session = session is None

    def __repr__(self) -> str:
        return f"HttpBotAPI(base_url={self.base_url!r}, timeout={self.timeout!r})"

    def _mask(self, text: str) -> str:
        return self.__pattern.sub(_MASK, text) if self.__pattern is not None else text

    def redact(self, text: str) -> str:
        """``text`` with this bot's token replaced by ``<token>``: whole, with its ``:``
        percent-encoded (``%3A``, ``%253A``), or its secret alone.

        Args:
            text: any text (an error description, a log detail).
        """
        return self._mask(text)

    def carries_token(self, params: bytes) -> bool:
        """Whether encoded params (or a key, as bytes) hold this bot's token anywhere
        (in a URL too), as written or percent-encoded (``%3A`` for the ``:``, the whole
        token encoded, encoded twice); the secret after ``:`` alone counts.
        :class:`~telegram_idem.outbox.Outbound` refuses to store such a call.

        Args:
            params: the encoded params (:func:`~telegram_idem.outbox.encode_params`).
        """
        if not self.__needles:
            return False
        text = params.decode("ascii", "replace")
        for _ in range(_DECODINGS):
            if any(needle in text for needle in self.__needles):
                return True
            decoded = unquote(text)
            if decoded == text:
                return False
            text = decoded
        return any(needle in text for needle in self.__needles)

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or (self._owns_session and self._session.closed):
            import aiohttp

            self._session = aiohttp.ClientSession()
            self._owns_session = True
        return self._session

    async def warm(self) -> None:
        """Import aiohttp and make the session now, not in the first call. Idempotent.

        The relay awaits it before its first flood reservation: a cold process paid
        0.2–0.6 s of import and set-up between its first reservations and their
        requests (measured, 2–3 processes on loopback), so its first calls reached
        Telegram late, together with later ones, and were answered 429.
        """
        self._session_now()

    async def call(self, method: str, params: bytes) -> Answer:
        """:meth:`BotAPI.call` over HTTP (see the module docstring for what raises what).

        Args:
            method: the Bot API method.
            params: the stored JSON params (bytes).

        Raises:
            CallNotSent: the request never left.
            AmbiguousCall: it may have been applied; no answer came.
        """
        import aiohttp

        url = f"{self.base_url}/bot{self.__token}/{method}"
        try:
            decoded = json.loads(params) if params else {}
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            raise CallNotSent(f"{method}: the stored params are not a JSON object", method=method)
        # Failures are raised outside the except blocks, so they carry no __context__:
        # aiohttp's exceptions name the URL, and the URL holds the token.
        failure: CallNotSent | AmbiguousCall | None = None
        with ExitStack() as files:
            try:
                data, headers = _body(params, decoded, files)
            except OSError as exc:
                failure = CallNotSent(
                    f"{method}: a file to upload cannot be read: {self._mask(str(exc))}",
                    method=method,
                )
            except Exception as exc:  # the request was never written: not sent
                failure = CallNotSent(
                    f"{method}: the request could not be built: {type(exc).__name__}: "
                    f"{self._mask(str(exc))}",
                    method=method,
                )
            if failure is None:
                try:
                    async with self._session_now().post(
                        url,
                        data=data,
                        headers=headers,
                        timeout=aiohttp.ClientTimeout(total=self.timeout),
                    ) as response:
                        status = response.status
                        raw = await response.read()
                except (
                    aiohttp.ClientConnectorError,
                    aiohttp.ConnectionTimeoutError,
                    aiohttp.InvalidURL,
                    aiohttp.NonHttpUrlClientError,
                ) as exc:
                    failure = CallNotSent(self._failure(method, exc, "not sent"), method=method)
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    failure = AmbiguousCall(self._failure(method, exc, "no answer"), method=method)
        if failure is not None:
            raise failure
        return self._answer(method, status, raw)

    def _failure(self, method: str, exc: BaseException, what: str) -> str:
        detail = self._mask(str(exc)) or "(no detail)"
        return f"{method}: {what}: {type(exc).__name__}: {detail}"

    def _answer(self, method: str, status: int, raw: bytes) -> Answer:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if isinstance(body, dict):
            return Answer.from_json(body, status=status)
        if 400 <= status < 500:
            return Answer(ok=False, error_code=status, description=f"HTTP {status}, not JSON")
        raise AmbiguousCall(
            f"{method}: HTTP {status} with a body that is not a Bot API answer", method=method
        )

    async def close(self) -> None:
        """Close the session this object made (a session given to it is left open).
        Idempotent."""
        session, self._session = self._session, None
        if session is not None and self._owns_session and not session.closed:
            await session.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _file_refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if set(value) == {FILE_FIELD} and isinstance(value[FILE_FIELD], str):
            yield value[FILE_FIELD]
            return
        for item in value.values():
            yield from _file_refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _file_refs(item)


def _body(
    raw: bytes, params: Any, files: ExitStack
) -> tuple[bytes | aiohttp.FormData, dict[str, str]]:
    """The request body: the stored JSON as it is, or a form when it names files."""
    if not isinstance(params, dict) or not any(True for _ in _file_refs(params)):
        return raw, {"Content-Type": "application/json"}
    import aiohttp

    form = aiohttp.FormData()
    parts: list[tuple[str, str]] = []

    def attach(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {FILE_FIELD} and isinstance(value[FILE_FIELD], str):
                name = f"file{len(parts)}"
                parts.append((name, value[FILE_FIELD]))
                return f"attach://{name}"
            return {k: attach(v) for k, v in value.items()}
        if isinstance(value, list):
            return [attach(v) for v in value]
        return value

    for field, value in params.items():
        if isinstance(value, dict) and set(value) == {FILE_FIELD}:
            path = Path(str(value[FILE_FIELD]))
            form.add_field(field, files.enter_context(path.open("rb")), filename=path.name)
            continue
        value = attach(value)
        form.add_field(field, value if isinstance(value, str) else json.dumps(value))
    for name, path_text in parts:
        path = Path(path_text)
        form.add_field(name, files.enter_context(path.open("rb")), filename=path.name)
    return form, {}
