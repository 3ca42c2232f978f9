"""The rules of search (db.search) without a database: where a cursor's page goes on in each
rank, a search by text's terms and weights, which vocabulary words are typos of a query word
(and where the index finds them), and the window a cursor may ask for."""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from db.schema import keyword_pairs
from db.search import (
    EDIT,
    EXACT,
    FIRST_WINDOW,
    RANK_OF_PAIR_COUNT,
    STEM,
    TYPOS,
    WINDOW,
    after_at_rank,
    pair_params,
    query_terms,
    query_window,
    typo_reach,
    typos_of,
)
from wire import values
from wire.errors import BadRequestError
from wire.values import MAX_QUERY_WORDS, TYPO_LENGTH, decode_cursor, encode_cursor, one_edit_apart


def test_a_cursor_goes_on_in_each_rank_exactly_after_the_last_item_shown() -> None:
    """Items ranked by matches (down), then item_id: for each place a page can end, a rank's
    items after it are those above after_at_rank's item_id, whatever the ranks' order."""
    ranked = sorted(((1 + i * 7 % 3, i) for i in range(1, 13)), key=lambda r: (-r[0], r[1]))
    assert {m for m, _ in ranked} == {1, 2, 3}
    for place, last in enumerate(ranked):
        for rank in (1, 2, 3):
            after = after_at_rank(last, rank)
            assert [i for m, i in ranked[place + 1:] if m == rank] == \
                [i for m, i in ranked if m == rank and i > after], (last, rank)
    assert after_at_rank(None, 2) == 0  # a first page: every item of every rank


def test_a_cursor_below_a_rank_leaves_nothing_of_it_even_the_largest_id() -> None:
    assert after_at_rank((1, 5), 2) >= 2**63 - 1  # every BIGINT item_id is at or below it


def test_an_items_rank_is_told_by_the_number_of_keyword_pairs_it_has() -> None:
    """The first page of three to five keywords counts pairs: m keywords make m(m-1)/2 of them."""
    for m in range(1, 6):
        assert RANK_OF_PAIR_COUNT[len(keyword_pairs([f"k{n}" for n in range(m)]))] == m
    with pytest.raises(BadRequestError):
        values.keywords("keywords", [f"k{n}" for n in range(6)])  # no more keywords than that


def test_the_pair_parameters_name_each_pair_once_in_index_order() -> None:
    assert pair_params(["lamp", "desk", "oak"]) == {
        "first0": "desk", "second0": "lamp", "first1": "desk", "second1": "oak",
        "first2": "lamp", "second2": "oak"}
    assert pair_params(["one"]) == {}


def test_a_query_word_matches_itself_its_stem_and_its_typos_each_weighed() -> None:
    assert query_terms(["lamps"], {"lamps": ["damps", "lamas"]}) == [
        ("lamps", 0, EXACT), ("lamp", 0, STEM), ("~lamp", 0, STEM), ("damps", 0, EDIT), ("lamas", 0, EDIT)]


def test_a_word_that_is_its_own_stem_keeps_its_exact_weight() -> None:
    assert query_terms(["lamp"], {}) == [("lamp", 0, EXACT), ("~lamp", 0, STEM)]
    assert query_terms(["lamps"], {"lamps": ["lamp"]})[:2] == [("lamps", 0, EXACT), ("lamp", 0, STEM)]


@pytest.mark.parametrize("word", ["2024", "直", "naïve", "x1"])
def test_words_of_digits_or_other_scripts_match_only_themselves(word: str) -> None:
    assert query_terms([word], {}) == [(word, 0, EXACT)]


def test_each_query_word_is_numbered_for_the_rank_to_count_it_once() -> None:
    terms = query_terms(["oak", "desks"], {"desks": ["decks"]})
    assert [(word, group) for word, group, _ in terms] == [
        ("oak", 0), ("~oak", 0), ("desks", 1), ("desk", 1), ("~desk", 1), ("decks", 1)]


def test_the_weights_rank_by_words_matched_then_equal_words_then_stems() -> None:
    """Any number of query words (at most eight, each counted at its best match): one more word
    matched outranks every other difference, then one more equal word, then one more stem."""
    assert EXACT > STEM > EDIT
    kinds = [(exact, stems, typos) for exact, stems, typos in itertools.product(range(9), repeat=3)
             if exact + stems + typos <= MAX_QUERY_WORDS]
    rank = {k: EXACT * k[0] + STEM * k[1] + EDIT * k[2] for k in kinds}
    assert len(set(rank.values())) == len(kinds)  # no two kinds of match tie
    assert sorted(kinds, key=rank.__getitem__) == sorted(kinds, key=lambda k: (sum(k), k[0], k[1]))


def edits(word: str, letters: str) -> Iterator[str]:
    """Every word one edit from `word`: a letter added, dropped, changed, or two neighbours swapped."""
    for n in range(len(word) + 1):
        yield from (word[:n] + c + word[n:] for c in letters)
        if n < len(word):
            yield word[:n] + word[n + 1:]
            yield from (word[:n] + c + word[n + 1:] for c in letters)
        if n < len(word) - 1:
            yield word[:n] + word[n + 1] + word[n] + word[n + 2:]


def words(letters: str, lengths: range) -> list[str]:
    return ["".join(w) for n in lengths for w in itertools.product(letters, repeat=n)]


def test_one_edit_apart_is_exactly_one_edit() -> None:
    for first in words("ab", range(6)):
        near = set(edits(first, "ab")) - {first}
        for second in words("ab", range(7)):
            assert one_edit_apart(first, second) == (second in near), (first, second)


def test_every_word_one_edit_away_shares_the_first_or_the_last_letters_read() -> None:
    """The vocabulary is read in two ranges a length, by the query word's first letters and by its
    last: a typo outside both would never be found."""
    for word in words("abc", range(TYPO_LENGTH, TYPO_LENGTH + 2)) + ["abcdefghij", "aaaaaaaaaaab"]:
        head, tail = typo_reach(word)
        assert len(head) == len(tail) == (len(word) - 1) // 2
        for typo in set(edits(word, "abcz")) - {word}:
            assert typo.startswith(head) or typo[::-1].startswith(tail), (word, typo)


def test_a_query_word_matches_the_first_few_typos_in_word_order_and_nothing_two_edits_away() -> None:
    found = {"tables", "cable", "fable", "stable", "tabel", "table", "tablet", "tbl", "gable"}
    assert typos_of("table", found) == ["cable", "fable"][:TYPOS]
    assert typos_of("tabel", {"table", "label", "tab", "tabled"}) == ["label", "table"][:TYPOS]
    assert typos_of("zzzzz", found) == []


def test_a_first_page_reads_the_first_window_or_twice_the_page() -> None:
    assert query_window(None, 11) == FIRST_WINDOW
    assert query_window(None, 501) == min(1002, WINDOW)  # the longest page, plus one


@pytest.mark.parametrize(("window", "read"), [(1, 1), (500, 500), (WINDOW, WINDOW), (0, 1), (-7, 1),
                                              (WINDOW + 1, WINDOW), (2**63 - 1, WINDOW)])
def test_a_later_page_reads_its_cursors_window_bounded_whatever_the_cursor_says(window: int,
                                                                                read: int) -> None:
    last = decode_cursor(encode_cursor(170, 42, window), 3)
    assert query_window(last, 11) == read


def test_a_cursor_of_another_searchs_shape_is_a_bad_request() -> None:
    by_keywords, by_text = encode_cursor(2, 42), encode_cursor(170, 42, 1000)
    with pytest.raises(BadRequestError, match="^cursor: "):
        decode_cursor(by_keywords, 3)
    with pytest.raises(BadRequestError, match="^cursor: "):
        decode_cursor(by_text, 2)
    with pytest.raises(BadRequestError, match="^cursor: "):
        decode_cursor(encode_cursor(2**63), 1)  # no BIGINT holds it
