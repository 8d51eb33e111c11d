"""The one HTTP-status classification every integration reads."""

from __future__ import annotations

import pytest

from outbound.statuses import Answer, classify_status


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        (200, Answer.OK), (204, Answer.OK), (301, Answer.OK), (304, Answer.OK),
        (429, Answer.RATE_LIMITED),
        (408, Answer.TRANSIENT), (425, Answer.TRANSIENT), (500, Answer.TRANSIENT),
        (501, Answer.TRANSIENT), (502, Answer.TRANSIENT), (503, Answer.TRANSIENT),
        (504, Answer.TRANSIENT), (599, Answer.TRANSIENT),
        (400, Answer.PERMANENT), (401, Answer.PERMANENT), (403, Answer.PERMANENT),
        (404, Answer.PERMANENT), (410, Answer.PERMANENT), (422, Answer.PERMANENT),
    ],
)  # fmt: skip
def test_each_status_has_one_answer(status, answer):
    assert classify_status(status) is answer


def test_a_response_the_rate_limit_classification_calls_a_limit_is_rate_limited():
    # A 403 with Retry-After, or a GraphQL 200 whose errors say RATE_LIMITED.
    assert classify_status(403, rate_limited=True) is Answer.RATE_LIMITED
    assert classify_status(200, rate_limited=True) is Answer.RATE_LIMITED


def test_rate_limits_and_transient_trouble_are_retryable_and_nothing_else_is():
    assert {answer for answer in Answer if answer.retryable} == {
        Answer.RATE_LIMITED,
        Answer.TRANSIENT,
    }
