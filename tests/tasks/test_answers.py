import pytest

from whale.tasks.answers import em_f1, normalize_answer, numbers_match, parse_number


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an  apple,  a day ", "apple day"),
        ("U.S.A.", "usa"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_em_ignores_case_articles_and_punctuation():
    assert em_f1("the Beatles.", "Beatles") == (1.0, 1.0)


def test_f1_gives_partial_credit():
    em, f1 = em_f1("John Lennon", "John Winston Lennon")
    assert em == 0.0 and f1 == pytest.approx(0.8)


def test_yes_no_get_no_partial_credit():
    assert em_f1("yes indeed", "yes") == (0.0, 0.0)


@pytest.mark.parametrize(
    "a, b",
    [
        ("1,234", "1234"),
        ("0.5", "1/2"),
        ("\\frac{3}{4}", "0.75"),
        ("\\boxed{42}", "42"),
        ("50%", "0.5"),
        ("$7$", "7"),
        ("\\dfrac{1}{3}", "1/3"),
    ],
)
def test_numbers_match(a, b):
    assert numbers_match(a, b)


def test_different_numbers_do_not_match():
    assert not numbers_match("41", "42") and parse_number("forty") is None
