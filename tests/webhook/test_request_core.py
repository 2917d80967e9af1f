"""The framework-free webhook request core: every row of its table, header case, odd
Unicode, the body bound to the byte, secret rotation, and that nothing a request holds
makes it raise."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from telegram_idem import webhook_request
from telegram_idem._webhook_secret import SecretCheck, secret_check
from telegram_idem.webhook_request import (
    BODY_INCOMPLETE,
    DEFAULT_MAX_BODY,
    SECRET_HEADER,
    Refusal,
    WebhookUpdate,
    body_too_large,
    check_request_body,
    check_request_head,
    check_webhook_request,
    header,
)

SECRET = "core-secret_0123"
CHECK = secret_check(SECRET)
GOOD = {SECRET_HEADER: SECRET}
UPDATE = b'{"update_id": 734519001, "message": {"message_id": 1, "text": "hi"}}'
ROOT = Path(__file__).resolve().parents[2]


def check(
    body: bytes = UPDATE,
    *,
    method: str | None = "POST",
    headers: Mapping[str, Any] | None = None,
    secret: SecretCheck = CHECK,
    max_body: int = DEFAULT_MAX_BODY,
    base64_encoded: bool = False,
) -> Refusal | WebhookUpdate:
    return check_webhook_request(
        method,
        GOOD if headers is None else headers,
        body,
        secret=secret,
        max_body=max_body,
        base64_encoded=base64_encoded,
    )


def status(result: Refusal | WebhookUpdate) -> int:
    return result.status if isinstance(result, Refusal) else 200


def padded(size: int) -> bytes:
    """A valid update of exactly ``size`` bytes (JSON allows trailing whitespace)."""
    assert size >= len(UPDATE)
    return UPDATE + b" " * (size - len(UPDATE))


# ------------------------------------------------------------------ the table


def test_an_update_comes_back_parsed_with_its_bytes() -> None:
    result = check()
    assert isinstance(result, WebhookUpdate)
    assert result.update == json.loads(UPDATE)
    assert result.update_id == 734519001
    assert result.body == UPDATE


@pytest.mark.parametrize("method", ["GET", "PUT", "HEAD", "DELETE", "OPTIONS", "get"])
def test_a_method_other_than_post_is_405_with_allow(method: str) -> None:
    result = check(method=method)
    assert isinstance(result, Refusal)
    assert (result.status, dict(result.headers)) == (405, {"Allow": "POST"})


@pytest.mark.parametrize("method", ["POST", "post", None])
def test_post_in_any_case_or_an_unknown_method_passes(method: str | None) -> None:
    assert status(check(method=method)) == 200


@pytest.mark.parametrize(
    "headers",
    [{}, {SECRET_HEADER: ""}, {SECRET_HEADER: "wrong"}, {SECRET_HEADER: SECRET.upper()}],
    ids=["absent", "empty", "wrong", "other-case-value"],
)
def test_a_missing_or_wrong_secret_is_401(headers: dict[str, str]) -> None:
    result = check(headers=headers)
    assert isinstance(result, Refusal)
    assert (result.status, result.reason) == (401, "wrong or missing secret token")


@pytest.mark.parametrize(
    "name",
    [
        SECRET_HEADER,
        SECRET_HEADER.lower(),
        SECRET_HEADER.upper(),
        "x-TELEGRAM-bot-api-Secret-token",
    ],
)
def test_the_secret_header_name_is_read_in_any_case(name: str) -> None:
    assert status(check(headers={"content-type": "application/json", name: SECRET})) == 200


def test_a_header_name_that_only_lowercases_to_the_secret_header_is_not_it() -> None:
    kelvin = SECRET_HEADER.replace("k", "\u212a")  # KELVIN SIGN: "\u212a".lower() == "k"
    assert kelvin.lower() == SECRET_HEADER.lower()
    assert status(check(headers={kelvin: SECRET})) == 401


def test_a_secret_header_sent_twice_is_never_the_secret() -> None:
    """aiohttp's multidict keeps both values, a Lambda Function URL joins them with a
    comma: either way the value read is both, joined, and no secret holds a comma."""
    twice = CIMultiDict([(SECRET_HEADER, SECRET), (SECRET_HEADER.lower(), SECRET)])
    assert header(twice, SECRET_HEADER) == f"{SECRET},{SECRET}"
    assert status(check(headers=twice)) == 401
    assert status(check(headers={SECRET_HEADER: SECRET, SECRET_HEADER.lower(): "x"})) == 401
    assert status(check(headers=CIMultiDict([(SECRET_HEADER.lower(), SECRET)]))) == 200


def test_a_header_value_that_is_not_a_string_is_absent() -> None:
    assert header({"x-a": 5}, "X-A") is None  # type: ignore[dict-item]
    assert status(check(headers={SECRET_HEADER.lower(): None})) == 401


@pytest.mark.parametrize(
    "value",
    [
        SECRET + "\udcff",  # aiohttp's surrogateescape of a byte that is not UTF-8
        "\ud800" + SECRET,  # a lone surrogate
        "s\u00e9cret",
        "\x00" * 16,
        "x" * 100_000,
    ],
    ids=["surrogate-escape", "lone-surrogate", "non-ascii", "nul", "huge"],
)
def test_an_odd_secret_header_value_is_a_wrong_secret_not_an_error(value: str) -> None:
    assert status(check(headers={SECRET_HEADER: value})) == 401


def test_rotation_accepts_every_configured_secret_and_nothing_else() -> None:
    rotating = secret_check(["old-secret", "new-secret"])
    statuses = [
        status(check(headers={SECRET_HEADER: given}, secret=rotating))
        for given in ("old-secret", "new-secret", "old-secretx", "new", "")
    ]
    assert statuses == [200, 200, 401, 401, 401]


def test_without_a_secret_any_request_passes_the_secret_check() -> None:
    open_check = secret_check(None, allow_unauthenticated=True)
    assert status(check(headers={}, secret=open_check)) == 200
    assert status(check(headers={SECRET_HEADER: "anything"}, secret=open_check)) == 200


def test_a_body_of_exactly_max_body_bytes_is_read_and_one_more_is_413() -> None:
    size = 4096
    assert status(check(padded(size), max_body=size)) == 200
    result = check(padded(size + 1), max_body=size)
    assert isinstance(result, Refusal)
    assert (result.status, result.size, result.limit) == (413, size + 1, size)
    assert result.reason == "body too large (over 4096 bytes)"


def test_the_default_bound_is_one_mebibyte() -> None:
    assert status(check(padded(1024 * 1024))) == 200
    assert status(check(padded(1024 * 1024 + 1))) == 413


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"{not json",
        b"\xff\xfe\xfa",  # not UTF-8/16/32
        b'{"update_id": 1, "text": "\xff"}',  # one byte that is not UTF-8
        b"[1, 2]",
        b'"update_id"',
        b"null",
        b"{}",
        b'{"message": {}}',
        b'{"update_id": "1"}',
        b'{"update_id": true}',
        b'{"update_id": false}',
        b'{"update_id": null}',
        b'{"update_id": 1.0}',
        b'{"update_id": 1e400}',
        b'{"update_id": NaN}',
        b'{"update_id": 1, "x": Infinity}',
        b'{"update_id": 1, "x": -Infinity}',
        b'{"update_id": ' + b"9" * 5000 + b"}",  # past Python's int digit limit
        b"[" * 100_000 + b"]" * 100_000,  # nesting past the recursion limit
        b'{"update_id": 1',
        b'{"update_id": 1}}',
    ],
    ids=lambda b: repr(b[:24]),
)
def test_what_is_not_json_with_an_integer_update_id_is_400(body: bytes) -> None:
    result = check(body)
    assert isinstance(result, Refusal)
    assert result.status == 400


def test_a_bool_update_id_says_why() -> None:
    result = check(b'{"update_id": true, "message": {}}')
    assert result == Refusal(400, "an update needs an integer 'update_id'")


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (
            b'{"update_id": 5, "message": {"text": "\\ud800"}}',
            "\ud800",
        ),  # escape: Telegram may send it
        ('{"update_id": 5, "message": {"text": "한국어 🎉"}}'.encode(), "한국어 🎉"),
        (b"\xef\xbb\xbf" + b'{"update_id": 5, "message": {"text": "bom"}}', "bom"),
        ('{"update_id": 5, "message": {"text": "utf16"}}'.encode("utf-16-le"), "utf16"),
        ('{"update_id": 5, "message": {"text": "utf32"}}'.encode("utf-32-be"), "utf32"),
        (b'{"update_id": 5, "message": {"text": "\\u0000"}}', "\x00"),
    ],
    ids=["lone-surrogate-escape", "korean-emoji", "utf8-bom", "utf16", "utf32", "nul-escape"],
)
def test_odd_but_valid_unicode_is_an_update(body: bytes, text: str) -> None:
    result = check(body)
    assert isinstance(result, WebhookUpdate)
    assert result.update["message"]["text"] == text


def test_the_largest_update_id_telegram_could_send_and_negative_ones_are_integers() -> None:
    assert status(check(b'{"update_id": 9223372036854775807}')) == 200
    assert status(check(b'{"update_id": -1}')) == 200


# ---------------------------------------------------------------- the order


def test_a_wrong_method_is_told_before_a_wrong_secret() -> None:
    assert status(check(method="GET", headers={})) == 405


def test_the_secret_is_checked_before_the_body_is_looked_at() -> None:
    """An unauthenticated client learns nothing about the size bound or the parser."""
    assert status(check(b"x" * (DEFAULT_MAX_BODY + 1), headers={})) == 401
    assert status(check(b"not json", headers={})) == 401


# ----------------------------------------------------------- base64 bodies


def test_a_base64_body_is_decoded_and_its_bound_counts_decoded_bytes() -> None:
    size = 3000
    encoded = base64.b64encode(padded(size))
    assert len(encoded) > size
    result = check(encoded, max_body=size, base64_encoded=True)
    assert isinstance(result, WebhookUpdate) and result.body == padded(size)
    assert (
        status(check(base64.b64encode(padded(size + 1)), max_body=size, base64_encoded=True)) == 413
    )


@pytest.mark.parametrize("body", [b"{not base64}", b"e30=\n", "ünï".encode(), b"e30"], ids=repr)
def test_a_body_that_is_not_valid_base64_is_400(body: bytes) -> None:
    result = check(body, base64_encoded=True)
    assert result == Refusal(400, "body is not valid base64")


def test_a_huge_base64_body_is_413_before_it_is_decoded() -> None:
    result = check(b"!" * (4 * 1024 * 1024), base64_encoded=True)  # not base64 either
    assert isinstance(result, Refusal) and result.status == 413


# ----------------------------------------------------- the streaming shells


def test_the_head_refuses_a_declared_length_over_the_bound_before_reading() -> None:
    assert check_request_head("POST", GOOD, secret=CHECK, max_body=10, content_length=10) is None
    refused = check_request_head("POST", GOOD, secret=CHECK, max_body=10, content_length=11)
    assert refused == body_too_large(10, 11)
    assert refused is not None and refused.status == 413
    assert check_request_head("POST", {}, secret=CHECK, content_length=10**12) is not None


def test_the_body_check_alone_is_what_follows_the_head() -> None:
    assert status(check_request_body(padded(100), max_body=100)) == 200
    assert status(check_request_body(padded(101), max_body=100)) == 413
    assert status(check_request_body(b"[]")) == 400


def test_the_read_timeout_answer_is_408() -> None:
    assert (BODY_INCOMPLETE.status, BODY_INCOMPLETE.reason) == (408, "request body incomplete")


# ------------------------------------------------------- nothing raises


@settings(max_examples=300, deadline=None)
@given(
    method=st.one_of(st.none(), st.text(max_size=8)),
    headers=st.dictionaries(st.text(max_size=40), st.text(max_size=40), max_size=4),
    body=st.binary(max_size=512),
    base64_encoded=st.booleans(),
)
def test_nothing_a_request_holds_makes_the_check_raise(
    method: str | None, headers: dict[str, str], body: bytes, base64_encoded: bool
) -> None:
    for secret in (CHECK, secret_check(None, allow_unauthenticated=True)):
        result = check_webhook_request(
            method, headers, body, secret=secret, max_body=256, base64_encoded=base64_encoded
        )
        assert isinstance(result, Refusal | WebhookUpdate)
        if isinstance(result, Refusal):
            assert result.status in {405, 401, 413, 400}


@settings(max_examples=200, deadline=None)
@given(update_id=st.integers(), text=st.text())
def test_every_integer_update_id_and_any_text_is_an_update(update_id: int, text: str) -> None:
    body = json.dumps({"update_id": update_id, "message": {"text": text}}).encode()
    result = check(body)
    assert isinstance(result, WebhookUpdate)
    assert result.update == {"update_id": update_id, "message": {"text": text}}


# ------------------------------------------------ the table is the docs' table


def _statuses(table_text: str) -> set[int]:
    return {int(s) for s in re.findall(r"\|\s*\**(\d{3})\b", table_text)}


def test_the_docstring_table_and_the_answers_page_list_the_same_refusals() -> None:
    doc = webhook_request.__doc__ or ""
    core_table = doc[doc.index("| request") : doc.index("The secret header")]
    page = (ROOT / "docs" / "answers.md").read_text(encoding="utf-8")
    section = page[page.index("## The request checks") :]
    section = section[: section.index("\n## ", 1)]
    page_refusals = _statuses(section) - {200}
    assert _statuses(core_table) == page_refusals == {405, 401, 413, 408, 400}
