"""The legacy native path's run-at-a-time calls (r7-legacy-rx): the credit told of a dispatch's sends and
a run's answers in one call, and the in-flight tracker's per-run questions, each exactly what the
one-at-a-time calls make of the same sequence."""

from __future__ import annotations

import random

from pzq.credit import NativeCredit
from pzq.inflight import InFlight


def _state(credit: NativeCredit) -> tuple:
    young, order = dict(credit._young), list(credit._order)
    return (young, credit._sends, credit._passed, credit.latency_s, credit._answered_at, order)


def test_a_run_of_sends_and_answers_leaves_the_credit_as_the_same_calls_one_at_a_time():
    rng = random.Random(27)
    one, many = NativeCredit(100, 30.0), NativeCredit(100, 30.0)
    now = 1000.0
    for turn in range(50):
        refs = [(1, turn * 10 + i) for i in range(10)]
        for ref in refs:
            one.sent(ref, now)
        many.sent_many(refs, now)
        now += rng.random() * 0.01
        # answers out of order, some for deliveries not in flight (sent_at None), one repeated
        answers = [(ref, None if rng.random() < 0.2 else now - rng.random() * 0.05) for ref in refs]
        rng.shuffle(answers)
        answers.append(answers[0])
        for ref, sent_at in answers:
            one.answered(ref, sent_at, now)
        many.answered_many(answers, now)
        assert _state(one) == _state(many)
        assert one.available(now, 5) == many.available(now, 5)


def test_a_run_of_answers_none_of_them_timed_leaves_the_last_answer_time_alone():
    credit = NativeCredit(10, 30.0)
    credit.sent((1, 1), 5.0)
    credit.answered_many([((1, 1), None)], 6.0)
    assert credit._answered_at == float("-inf"), "an answer for nothing in flight proves nobody answers"


def test_the_trackers_questions_of_a_run_answer_for_one_consumer_only():
    inflight: InFlight = InFlight()
    inflight.add((1, 1), 10.0, "native")
    inflight.add((1, 2), 20.0, "other")
    deadline, holds = inflight.deadline_of("native"), inflight.held_by("native")
    assert deadline((1, 1)) == 10.0 and holds((1, 1))
    assert deadline((1, 2)) is None and not holds((1, 2)), "another consumer's delivery"
    assert deadline((1, 3)) is None and not holds((1, 3)), "nothing in flight"
    inflight.remove((1, 1))
    inflight.add((1, 4), 30.0, "native")
    assert deadline((1, 1)) is None and deadline((1, 4)) == 30.0, "the functions see later changes"
