"""Who writes the posts: the :class:`Writer` interface and an offline stand-in.

:class:`OfflineWriter` imitates an LLM without a network: deterministic text in
Korean, English and Japanese, and the latency of the pipeline in docs/design/incident.md
(title ~4.5 s, Korean draft ~25 s, each translation ~20 s; with the two
translations in parallel one post takes ~50 s, longer than Telegram waits for a
webhook answer).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

TRANSLATION_LANGS: tuple[str, ...] = ("en", "ja")
"""Languages :meth:`Writer.translate` accepts."""

TITLE_SECONDS = 4.5
DRAFT_SECONDS = 25.0
TRANSLATE_SECONDS = 20.0


class Writer(Protocol):
    """Produces the text of a post. Implementations may take tens of seconds."""

    async def title(self, topic: str) -> str:
        """A Korean title for ``topic`` (``""``: the topic comes from chat history)."""
        ...

    async def draft(self, title: str, topic: str) -> str:
        """The Korean markdown document (front matter ``title``, then sections)."""
        ...

    async def translate(self, markdown: str, lang: str) -> str:
        """``markdown`` translated to ``lang`` (``"en"`` or ``"ja"``), front matter included.

        Raises:
            ValueError: for any other ``lang``.
        """
        ...


# One tuple per line the offline writer can produce: (ko, en, ja). Placeholders
# in braces are carried over from the Korean text when translating.
_TITLES: tuple[tuple[str, str, str], ...] = (
    ("{topic} 실전 가이드", "{topic}: A Practical Guide", "{topic} 実践ガイド"),
    ("웹훅 노트 #{n}", "Webhook Notes #{n}", "Webhook ノート #{n}"),
)
_LINES: tuple[tuple[str, str, str], ...] = (
    (
        "> 이 글은 텔레그램 봇 대화를 바탕으로 작성되었습니다.",
        "> This post was written from a Telegram bot conversation.",
        "> この記事はTelegramボットでの会話をもとに書かれました。",
    ),
    ("## 배경", "## Background", "## 背景"),
    (
        "{subject}을(를) 운영 환경에 적용하면서 겪은 문제와 해결 과정을 정리합니다.",
        "This post sums up the problems we hit running {subject} in production, and the fixes.",
        "{subject}を本番環境で運用する中で遭遇した問題と、その解決方法をまとめます。",
    ),
    (
        "텔레그램 웹훅은 제한 시간 안에 2xx 응답을 받지 못하면 같은 update_id로 요청을 다시 보냅니다.",
        "Telegram re-sends a webhook with the same update_id when no 2xx answer comes in time.",
        "Telegramのwebhookは時間内に2xx応答が返らないと、同じupdate_idで再送します。",
    ),
    ("## 문제", "## The problem", "## 問題"),
    (
        "긴 작업을 웹훅 요청 안에서 처리하면 재시도가 겹치면서 같은 작업이 여러 번 실행됩니다.",
        "When long work runs inside the webhook request, retries overlap and the job runs again.",
        "長い処理をwebhookリクエスト内で実行すると、再送が重なり同じ処理が何度も実行されます。",
    ),
    ("## 해결", "## The fix", "## 解決策"),
    (
        "1. update_id를 원자적으로 기록하고, 중복 요청에는 바로 200으로 응답합니다.",
        "1. Record the update_id atomically and answer duplicates with 200 at once.",
        "1. update_idをアトミックに記録し、重複リクエストには即座に200を返します。",
    ),
    (
        "2. 무거운 작업은 백그라운드 워커에서 처리합니다.",
        "2. Run heavy work in a background worker.",
        "2. 重い処理はバックグラウンドワーカーで実行します。",
    ),
    (
        "3. 글 파일과 인덱스는 한 번의 커밋으로 반영합니다.",
        "3. Write the post files and the index in a single commit.",
        "3. 記事ファイルとインデックスは1回のコミットで反映します。",
    ),
    ("## 정리", "## Summary", "## まとめ"),
    (
        "{subject}의 핵심은 같은 요청이 여러 번 와도 결과가 한 번만 남도록 만드는 것입니다.",
        "The key to {subject} is that a request arriving many times leaves its result once.",
        "{subject}の要点は、同じリクエストが何度届いても結果が一度だけ残るようにすることです。",
    ),
)
_CODE = (
    "```python",
    "if not await guard.claim(update.update_id):",
    "    return web.Response(status=200)  # a retry: answer at once",
    "```",
)
# The subject of a topic-less post: what the chat history was about.
_DEFAULT_SUBJECT = {
    "ko": "텔레그램 웹훅 처리",
    "en": "Telegram webhook handling",
    "ja": "Telegramのwebhook処理",
}
_COLUMN = {"ko": 0, "en": 1, "ja": 2}


def _pattern(template: str) -> re.Pattern[str]:
    """Regex matching ``template`` with each ``{name}`` captured."""
    parts = re.split(r"\{(\w+)\}", template)
    regex = "".join(
        re.escape(part) if i % 2 == 0 else (r"(?P<n>\d+)" if part == "n" else f"(?P<{part}>.+?)")
        for i, part in enumerate(parts)
    )
    return re.compile(f"^{regex}$")


_TITLE_TABLE = [(_pattern(row[0]), row) for row in _TITLES]
_LINE_TABLE = [(_pattern(row[0]), row) for row in _LINES]


def _translate_line(
    line: str, lang: str, table: list[tuple[re.Pattern[str], tuple[str, str, str]]]
) -> str:
    for pattern, row in table:
        match = pattern.match(line)
        if match is None:
            continue
        values = match.groupdict()
        if values.get("subject") == _DEFAULT_SUBJECT["ko"]:
            values["subject"] = _DEFAULT_SUBJECT[lang]
        return row[_COLUMN[lang]].format(**values)
    return line


def _clean(text: str) -> str:
    return " ".join(text.split())


class OfflineWriter:
    """A deterministic :class:`Writer` with simulated LLM latency.

    The same arguments give the same text, with one deliberate exception: a title
    for an empty topic (``/techpost`` without arguments, where a real LLM invents
    a title from chat history and gives a different one each time) carries a
    per-instance sequence number: ``"웹훅 노트 #1"``, then ``"웹훅 노트 #2"``… So
    a pipeline that asks twice for the title of one action publishes two
    different slugs, which makes duplicate generation visible.

    Translation understands the lines this class writes; any other line (code,
    unknown prose, a user-given title) is kept verbatim.

    Args:
        delay_scale: multiplies the simulated latencies (:data:`TITLE_SECONDS`,
            :data:`DRAFT_SECONDS`, :data:`TRANSLATE_SECONDS`, in seconds);
            ``1.0`` imitates docs/design/incident.md, ``0`` returns at once without sleeping.
        sleep: the coroutine used to wait, called with seconds (tests pass a
            recorder).

    Attributes:
        calls: how many times each method was called, keyed ``"title"``,
            ``"draft"``, ``"translate"`` (counted when the call starts).

    Raises:
        ValueError: when ``delay_scale`` is negative, infinite or NaN.
    """

    def __init__(
        self,
        delay_scale: float = 1.0,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if not (math.isfinite(delay_scale) and delay_scale >= 0):
            raise ValueError(f"delay_scale must be a finite number >= 0, got {delay_scale}")
        self.delay_scale = delay_scale
        self.calls: Counter[str] = Counter()
        self._sleep = sleep
        self._untitled = 0

    async def _wait(self, seconds: float) -> None:
        if seconds * self.delay_scale > 0:
            await self._sleep(seconds * self.delay_scale)

    async def title(self, topic: str) -> str:
        """A Korean title: ``"<topic> 실전 가이드"``, or ``"웹훅 노트 #<n>"`` for ``""``.

        Takes ``TITLE_SECONDS * delay_scale`` seconds.
        """
        self.calls["title"] += 1
        topic = _clean(topic)
        if topic:
            title = _TITLES[0][0].format(topic=topic)
        else:
            self._untitled += 1
            title = _TITLES[1][0].format(n=self._untitled)
        await self._wait(TITLE_SECONDS)
        return title

    async def draft(self, title: str, topic: str) -> str:
        """The Korean document: front matter ``title``, an H1, four ``##`` sections.

        Args:
            title: the post title (any text).
            topic: what the post is about; ``""`` means the chat history's subject
                (Telegram webhook handling).

        Takes ``DRAFT_SECONDS * delay_scale`` seconds.
        """
        self.calls["draft"] += 1
        await self._wait(DRAFT_SECONDS)
        title = _clean(title)
        subject = _clean(topic) or _DEFAULT_SUBJECT["ko"]
        ko = [row[0].format(subject=subject) for row in _LINES]
        body = [ko[0], "", ko[1], "", ko[2], ko[3], "", ko[4], "", ko[5], "", ko[6], ""]
        body += [ko[7], ko[8], ko[9], "", *_CODE, "", ko[10], "", ko[11]]
        head = ["---", f"title: {json.dumps(title, ensure_ascii=False)}", "---", "", f"# {title}"]
        return "\n".join([*head, "", *body]) + "\n"

    async def translate(self, markdown: str, lang: str) -> str:
        """``markdown`` in English (``"en"``) or Japanese (``"ja"``).

        The front matter ``title``, ``#`` headings and the known lines are
        translated; fenced code blocks and unknown lines are copied.

        Takes ``TRANSLATE_SECONDS * delay_scale`` seconds.

        Raises:
            ValueError: when ``lang`` is not in :data:`TRANSLATION_LANGS`.
        """
        if lang not in TRANSLATION_LANGS:
            raise ValueError(f"unsupported language {lang!r}; expected one of {TRANSLATION_LANGS}")
        self.calls["translate"] += 1
        await self._wait(TRANSLATE_SECONDS)
        out: list[str] = []
        in_front_matter = False
        in_code = False
        for number, line in enumerate(markdown.split("\n")):
            stripped = line.strip()
            if number == 0 and stripped == "---":
                in_front_matter = True
            elif in_front_matter and stripped == "---":
                in_front_matter = False
            elif in_front_matter and line.startswith("title:"):
                raw = line[len("title:") :].strip()
                try:
                    title = str(json.loads(raw)) if raw.startswith('"') else raw
                except ValueError:
                    title = raw
                translated = _translate_line(title, lang, _TITLE_TABLE)
                line = f"title: {json.dumps(translated, ensure_ascii=False)}"
            elif stripped.startswith("```"):
                in_code = not in_code
            elif not in_code and not in_front_matter:
                if line.startswith("# "):
                    line = "# " + _translate_line(line[2:], lang, _TITLE_TABLE)
                else:
                    line = _translate_line(line, lang, _LINE_TABLE)
            out.append(line)
        return "\n".join(out)


def writer_from_env(env: Mapping[str, str]) -> Writer:
    """The writer the bot uses, configured from environment variables.

    Args:
        env: e.g. ``os.environ``. ``WRITER_DELAY_SCALE`` (float, default ``1.0``)
            scales the simulated latency; ``0`` makes the pipeline instant.

    Returns:
        An :class:`OfflineWriter`.

    Raises:
        ValueError: when ``WRITER_DELAY_SCALE`` is not a finite number >= 0.
    """
    raw = env.get("WRITER_DELAY_SCALE", "").strip()
    try:
        scale = float(raw) if raw else 1.0
    except ValueError:
        raise ValueError(f"WRITER_DELAY_SCALE must be a number, got {raw!r}") from None
    return OfflineWriter(delay_scale=scale)
