"""The offline writer: deterministic text in three languages, docs/design/incident.md latency, call counts."""

from __future__ import annotations

import asyncio
import math
import re

import pytest

from examples.blog_bot.content import parse_front_matter
from examples.blog_bot.writer import (
    DRAFT_SECONDS,
    TITLE_SECONDS,
    TRANSLATE_SECONDS,
    OfflineWriter,
    Writer,
    writer_from_env,
)

HANGUL = re.compile(r"[\uac00-\ud7a3]")
KANA = re.compile(r"[\u3041-\u30ff]")


class SleepRecorder:
    """Records requested sleeps and how many overlap, without waiting."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.active = 0
        self.max_active = 0

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.active -= 1


async def pipeline(writer: Writer, topic: str) -> tuple[str, str, str, str]:
    title = await writer.title(topic)
    ko = await writer.draft(title, topic)
    en, ja = await asyncio.gather(writer.translate(ko, "en"), writer.translate(ko, "ja"))
    return title, ko, en, ja


async def test_same_input_same_output_across_instances() -> None:
    first = await pipeline(OfflineWriter(delay_scale=0), "Webhook retries")
    second = await pipeline(OfflineWriter(delay_scale=0), "Webhook retries")
    assert first == second


async def test_korean_draft_shape() -> None:
    writer = OfflineWriter(delay_scale=0)
    title = await writer.title("멱등성")
    ko = await writer.draft(title, "멱등성")
    fields, body = parse_front_matter(ko)
    assert fields["title"] == title == "멱등성 실전 가이드"
    assert body.startswith(f"# {title}\n")
    assert len(re.findall(r"^## ", body, re.MULTILINE)) >= 3
    assert "멱등성" in body


async def test_translations_are_in_the_target_language() -> None:
    _, ko, en, ja = await pipeline(OfflineWriter(delay_scale=0), "Webhook retries")
    assert parse_front_matter(en)[0]["title"] == "Webhook retries: A Practical Guide"
    assert parse_front_matter(ja)[0]["title"] == "Webhook retries 実践ガイド"
    assert not HANGUL.search(en)
    assert not HANGUL.search(ja) and KANA.search(ja)
    assert en.count("\n## ") == ko.count("\n## ") == ja.count("\n## ")


async def test_translation_keeps_code_and_unknown_lines() -> None:
    writer = OfflineWriter(delay_scale=0)
    source = "# 사용자 제목\n\n## 배경\n\n```\n## 배경\n```\n알 수 없는 문장\n"
    en = await writer.translate(source, "en")
    assert en == "# 사용자 제목\n\n## Background\n\n```\n## 배경\n```\n알 수 없는 문장\n"


async def test_translate_rejects_other_languages() -> None:
    writer = OfflineWriter(delay_scale=0)
    with pytest.raises(ValueError, match="fr"):
        await writer.translate("x", "fr")
    with pytest.raises(ValueError):
        await writer.translate("x", "ko")
    assert writer.calls["translate"] == 0


async def test_topicless_titles_differ_per_call_like_an_llm() -> None:
    writer = OfflineWriter(delay_scale=0)
    titles = [await writer.title(""), await writer.title("  "), await writer.title("")]
    assert titles == ["웹훅 노트 #1", "웹훅 노트 #2", "웹훅 노트 #3"]
    assert await OfflineWriter(delay_scale=0).title("") == "웹훅 노트 #1"
    assert await writer.title("주제") == await writer.title("주제")


async def test_topicless_post_translates_its_title() -> None:
    _, _, en, ja = await pipeline(OfflineWriter(delay_scale=0), "")
    assert parse_front_matter(en)[0]["title"] == "Webhook Notes #1"
    assert parse_front_matter(ja)[0]["title"] == "Webhook ノート #1"
    assert not HANGUL.search(en) and not HANGUL.search(ja)


async def test_calls_counts_each_method() -> None:
    writer = OfflineWriter(delay_scale=0)
    await pipeline(writer, "x")
    await writer.title("y")
    assert writer.calls == {"title": 2, "draft": 1, "translate": 2}


async def test_simulated_latency_is_scaled() -> None:
    sleep = SleepRecorder()
    await pipeline(OfflineWriter(delay_scale=0.5, sleep=sleep), "x")
    assert sorted(sleep.seconds) == sorted(
        [TITLE_SECONDS / 2, DRAFT_SECONDS / 2, TRANSLATE_SECONDS / 2, TRANSLATE_SECONDS / 2]
    )
    assert sleep.max_active == 2  # the two translations overlap


def test_full_scale_pipeline_outlasts_telegrams_patience() -> None:
    total = TITLE_SECONDS + DRAFT_SECONDS + TRANSLATE_SECONDS  # translations run in parallel
    assert 45 <= total <= 60


async def test_zero_scale_never_sleeps() -> None:
    sleep = SleepRecorder()
    await pipeline(OfflineWriter(delay_scale=0, sleep=sleep), "x")
    assert sleep.seconds == []


async def test_real_sleep_is_used_by_default() -> None:
    writer = OfflineWriter(delay_scale=0.001)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await writer.title("x")
    assert loop.time() - start >= TITLE_SECONDS * 0.001 * 0.9


@pytest.mark.parametrize("scale", [-1.0, math.inf, math.nan])
def test_invalid_delay_scale(scale: float) -> None:
    with pytest.raises(ValueError):
        OfflineWriter(delay_scale=scale)


@pytest.mark.parametrize(
    ("env", "scale"),
    [
        ({}, 1.0),
        ({"WRITER_DELAY_SCALE": ""}, 1.0),
        ({"WRITER_DELAY_SCALE": " 0 "}, 0.0),
        ({"WRITER_DELAY_SCALE": "0.25"}, 0.25),
    ],
)
def test_writer_from_env(env: dict[str, str], scale: float) -> None:
    writer = writer_from_env(env)
    assert isinstance(writer, OfflineWriter)
    assert writer.delay_scale == scale


@pytest.mark.parametrize("raw", ["fast", "-2", "inf"])
def test_writer_from_env_rejects_bad_values(raw: str) -> None:
    with pytest.raises(ValueError):
        writer_from_env({"WRITER_DELAY_SCALE": raw})
