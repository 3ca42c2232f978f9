"""Searching the items on sale: by category, keywords, or a shopper's words (search_items).

Keyword search ranks by matching keywords, then item_id, and pages with a cursor over exactly
that order: one keyword, and two without a category, by index ranges of item_keywords (and
item_keyword_pairs) read in item order; more, or two with a category, on a window of the
first items of each keyword (_ranked). A search by text (`query`) is ranked so on item_words, the
words of each item on sale, with the vocabulary for typos. Every search reads a bounded
number of index rows, whatever the catalogue.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    CompoundSelect,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    desc,
    func,
    literal_column,
    or_,
    select,
    union_all,
)

from wire.values import TYPO_LENGTH, decode_cursor, encode_cursor, one_edit_apart, stem

from .accounts import Session, with_session
from .catalog import ITEM_COLUMNS, item_to_wire, split_page
from .schema import item_keyword_pairs, item_keywords, item_words, items, keyword_pairs, vocabulary
from .unit_of_work import UnitOfWork


def search_items(tx: UnitOfWork, session: Session, category: int | None, keywords: list[str],
                 limit: int, cursor: str | None, query: Sequence[str] = ()) -> dict[str, Any]:
    """Items on sale, by category and/or keywords or the words of a query, best match first."""
    terms, by_category = list(keywords), category is not None
    params: dict[str, Any] = {**session.check_params, "category": category, "limit": limit + 1}
    if query:
        words = list(query)
        return _ranked(tx, session, params, query_terms(words, _typos(tx, words)), by_category, cursor)
    last = decode_cursor(cursor, 2) if cursor and terms else None  # (matches, item_id)
    params.update({f"keyword{n}": word for n, word in enumerate(terms)})
    if len(terms) > 2 and not by_category and last is None:
        params.update(pair_params(terms), window=WINDOW)
        statement = _many_keywords_first_page(len(terms))
    elif len(terms) > 1 and (by_category or last is not None and len(terms) > 2):
        weighed = [(word, n, 1) for n, word in enumerate(terms)]
        return _ranked(tx, session, params, weighed, by_category, last, keywords=True)
    elif len(terms) == 1:
        params["after"] = after_at_rank(last, 1)
        statement = _one_keyword_search(category is not None)
    elif len(terms) == 2 and category is None:
        params.update(pair_params(terms), after_both=after_at_rank(last, 2), after=after_at_rank(last, 1))
        statement = _two_keyword_search()
    else:
        params["after"] = decode_cursor(cursor, 1)[0] if cursor else 0
        statement = _plain_search(category is not None)
    cursor_of = ((lambda r: encode_cursor(r.matches, r.item_id)) if terms
                 else (lambda r: encode_cursor(r.item_id)))
    rows, next_cursor = split_page(session.accept_rows(tx.execute(statement, params).all()), limit, cursor_of)
    return {"items": [item_to_wire(r) for r in rows], "next_cursor": next_cursor}


@functools.cache
def _plain_search(by_category: bool) -> Select[Any]:
    """Items on sale after a cursor, by item_id (with the caller's session)."""
    on = (items.c.quantity > 0) & (items.c.item_id > bindparam("after"))
    if by_category:
        on &= items.c.category == bindparam("category")
    query = with_session(*ITEM_COLUMNS, joined=items, on=on)
    return query.order_by(items.c.item_id).limit(bindparam("limit", type_=Integer))


_AFTER_EVERYTHING = 2**63 - 1  # past the largest BIGINT: a cursor below rank 1 has nothing after it


def after_at_rank(last: tuple[int, ...] | None, rank: int) -> int:
    """The item_id after which the items of one rank (matching `rank` keywords) continue,
    given the decoded cursor: within a rank the order is item_id, and every rank follows
    the ranks above it."""
    if last is None:
        return 0
    last_matches, after = last
    if last_matches > rank:  # a cursor from a page above this rank: the whole rank follows it
        return 0
    return after if last_matches == rank else _AFTER_EVERYTHING


@functools.cache
def _one_keyword_search(by_category: bool) -> Select[Any]:
    """Items on sale with one keyword, by item_id: a range of the index read in order, stopped
    by the LIMIT, where counting matches would group and sort every match."""
    index, key = item_keywords, item_keywords.c.keyword
    on = (key == _keyword(0)) & (index.c.item_id > bindparam("after"))
    ranked = select(index.c.item_id, literal_column("1", Integer).label("matches"))
    if by_category:  # (keyword, category, item_id): in item_id order
        on &= index.c.category == bindparam("category")
    else:  # MariaDB reads (keyword, category, item_id) by keyword and sorts every match unless told
        ranked = ranked.with_hint(index, "FORCE INDEX (PRIMARY)", "mysql")  # mariadb:// too
    return _page_with_items(ranked.where(on).order_by(index.c.item_id))


@functools.cache
def _two_keyword_search() -> Select[Any]:
    """Items on sale with either of two keywords, those with both first, then by item_id.

    Three index ranges read in item order, each stopped by the LIMIT: the pair's (rank 2),
    and each keyword's without the items that have the other (rank 1), where counting
    matches would group and sort every item with either keyword. With a category the
    grouped statement (_ranked) reads only the category's part of each keyword's range, so
    this one is for searches without.
    """
    both = item_keyword_pairs
    on = _pair(0) & (both.c.item_id > bindparam("after_both"))
    # FORCE INDEX: as with one keyword, MariaDB would read the category index and sort every match
    ranked = (select(both.c.item_id, literal_column("2", Integer).label("matches"))
              .with_hint(both, "FORCE INDEX (PRIMARY)", "mysql"))
    pages = [_limited(ranked.where(on).order_by(both.c.item_id)), _only_keyword(0, 1), _only_keyword(1, 0)]
    return _page_with_items(union_all(*pages).order_by(desc("matches"), "item_id"))


def _only_keyword(n: int, other: int) -> Select[Any]:
    """One page of the items on sale with keyword n and not `other`, by item_id."""
    mine, theirs = item_keywords.alias(f"keyword{n}"), item_keywords.alias(f"keyword{other}")
    without = mine.outerjoin(theirs, (theirs.c.keyword == _keyword(other))
                             & (theirs.c.item_id == mine.c.item_id))
    on = (mine.c.keyword == _keyword(n)) & (mine.c.item_id > bindparam("after")) \
        & theirs.c.item_id.is_(None)
    ranked = (select(mine.c.item_id, literal_column("1", Integer).label("matches")).select_from(without)
              .with_hint(mine, "FORCE INDEX (PRIMARY)", "mysql")
              .with_hint(theirs, "FORCE INDEX (PRIMARY)", "mysql"))  # one row's look-up, not the range
    return _limited(ranked.where(on).order_by(mine.c.item_id))


def _limited(ranked: Select[Any], limit: str | int = "limit") -> Select[Any]:
    """A query cut to one page (or `limit` rows), wrapped so that it can stand in a UNION (SQLite too)."""
    page = ranked.limit(limit if isinstance(limit, int) else bindparam(limit, type_=Integer)).subquery()
    return select(*page.c)


# An item with m of the keywords has m(m-1)/2 of their pairs: its rank from its pair count.
RANK_OF_PAIR_COUNT = {m * (m - 1) // 2: m for m in range(1, 6)}


@functools.cache
def _many_keywords_first_page(keyword_count: int) -> Select[Any]:
    """The first page of a search of three to five keywords without a category.

    Every item with two or more of the keywords is on the pair index, so its rank is counted
    there from a few short ranges (the pairs' rows, each read in item order up to WINDOW),
    where counting it on the keyword index would group and sort every item with any of the
    keywords. The items with one keyword are read from each keyword's range in item order,
    stopped at the page's length L (`limit`, which is the page plus one). That is enough:
    with P < L items of rank two or more, the page's rank-one items are the smallest L - P of
    them, and before each, its keyword's range holds fewer than L - P rank-one items and at
    most P others, so it lies in the first L rows (with P >= L the page has none). Later
    pages are ranked on WINDOW items of each keyword (_ranked).
    """
    ranges = [_limited(select(item_keywords.c.item_id, literal_column("0", Integer).label("pairs"))
                       .with_hint(item_keywords, "FORCE INDEX (PRIMARY)", "mysql")  # item order
                       .where(item_keywords.c.keyword == _keyword(n)).order_by(item_keywords.c.item_id))
              for n in range(keyword_count)]
    pairs = [_limited(select(item_keyword_pairs.c.item_id, literal_column("1", Integer).label("pairs"))
                      .where(_pair(n)).order_by(item_keyword_pairs.c.item_id), "window")
             for n in range(keyword_count * (keyword_count - 1) // 2)]
    hits = union_all(*ranges, *pairs).subquery()
    matches = case(RANK_OF_PAIR_COUNT, value=func.sum(hits.c.pairs)).label("matches")
    ranked = select(hits.c.item_id, matches).group_by(hits.c.item_id)
    return _page_with_items(ranked.order_by(desc(matches), hits.c.item_id))


def pair_params(terms: list[str]) -> dict[str, Any]:
    """The parameters of the keywords' pairs on the pair index (_pair): first0, second0, ..."""
    params: dict[str, Any] = {}
    for n, (first, second) in enumerate(keyword_pairs(terms)):
        params.update({f"first{n}": first, f"second{n}": second})
    return params


def _pair(n: int) -> ColumnElement[bool]:
    """The pair index's rows of the keywords' pair n (pair_params)."""
    pair, pair_type = item_keyword_pairs, item_keyword_pairs.c.first_keyword.type
    return and_(pair.c.first_keyword == bindparam(f"first{n}", type_=pair_type),
                pair.c.second_keyword == bindparam(f"second{n}", type_=pair_type))


def _keyword(n: int) -> BindParameter[str]:
    return bindparam(f"keyword{n}", type_=item_keywords.c.keyword.type)


def _page_with_items(ranked: Select[Any] | CompoundSelect) -> Select[Any]:
    """A ranked (item_id, matches) query cut to one page, then joined to its items on sale."""
    page = ranked.limit(bindparam("limit", type_=Integer)).subquery()
    found = page.join(items, items.c.item_id == page.c.item_id)
    query = with_session(*ITEM_COLUMNS, page.c.matches, joined=found, on=items.c.quantity > 0)
    return query.order_by(desc(page.c.matches), page.c.item_id)


# Search by text. A query word's terms are the words of item_words it matches, each with a
# weight: itself (EXACT), its stem and "~" + its stem (STEM: item words sharing the stem), and
# up to TYPOS words of the vocabulary one edit away (EDIT). An item's rank is the sum, over the
# query words it matches, of the best weight: a word matched (81) outweighs any number of
# exact matches (9 each above 81) beyond it, and those any number of stems (1 each).
EXACT, STEM, EDIT = 90, 82, 81
TYPOS = 2  # vocabulary words matched per query word by one edit (the first in their order)
FIRST_WINDOW = 1000  # items read of each term's range for a first page (exact up to that)
WINDOW = 1000  # the most items read of each term's range, by a later page
CANDIDATES = 100  # vocabulary words read for typos by each of two reads, a query word
_LAST = "\U0010ffff"  # after every letter: a prefix's range ends at prefix + _LAST


Terms = list[tuple[str, int, int]]  # (word, query word's number, weight)


def _ranked(tx: UnitOfWork, session: Session, params: dict[str, Any], terms: Terms, by_category: bool,
            cursor: str | tuple[int, ...] | None, keywords: bool = False) -> dict[str, Any]:
    """A page of items ranked on terms (query_terms, or each keyword weighing 1).

    Each term's range of the index is read in item order, at most a window of rows: the
    ranking runs over those (every match while a term has no more items than the window,
    else its first), so that no search reads more than WINDOW rows a term whatever the
    catalogue. Keywords (their decoded cursor given) are ranked on WINDOW rows, exact while
    no keyword has more items. A query's first page's window is FIRST_WINDOW (or twice the
    page), each later one twice the last, up to WINDOW; its cursor holds (rank, item_id,
    window): a page holds the items of its window ranked after the last one shown."""
    last = decode_cursor(cursor, 3) if isinstance(cursor, str) else cursor
    window = WINDOW if keywords else query_window(last, params["limit"])
    for n, (word, group, weight) in enumerate(terms):
        params.update({f"term{n}": word, f"group{n}": group, f"weight{n}": weight})
    # One query word's first page: an item on it is within the first `limit` (L) rows of its best
    # term's range, as every item before it there ranks above it; so L rows a term are enough.
    one_word_first_page = not keywords and last is None and all(group == 0 for _, group, _ in terms)
    params.update(window=params["limit"] if one_word_first_page else window,
                  last_matches=last and last[0], after=last and last[1])
    rows = session.accept_rows(tx.execute(_ranked_search(len(terms), by_category, last is not None, keywords),
                                          params).all())
    wider = () if keywords else (min(2 * window, WINDOW),)  # int(): MariaDB's SUM is a DECIMAL
    rows, next_cursor = split_page(rows, params["limit"] - 1,
                                   lambda row: encode_cursor(int(row.matches), row.item_id, *wider))
    return {"items": [item_to_wire(r) for r in rows], "next_cursor": next_cursor}


def query_window(last: tuple[int, ...] | None, limit: int) -> int:
    """The rows a search by text reads of each term's range: FIRST_WINDOW (or `limit` twice) on a
    first page, else the cursor's (last[2]), in 1..WINDOW whatever the cursor says."""
    return min(max(last[2], 1), WINDOW) if last else min(max(FIRST_WINDOW, 2 * limit), WINDOW)


def query_terms(words: list[str], typos: dict[str, list[str]]) -> list[tuple[str, int, int]]:
    """(item word, query word's number, weight) for every word of item_words a query matches."""
    terms: list[tuple[str, int, int]] = []
    for group, word in enumerate(words):
        forms = {word: EXACT}
        if word.isascii() and word.isalpha():
            forms.setdefault(stem(word), STEM)
            forms.setdefault(f"~{stem(word)}", STEM)
        for typo in typos.get(word, []):
            forms.setdefault(typo, EDIT)
        terms += [(form, group, weight) for form, weight in forms.items()]
    return terms


def _typos(tx: UnitOfWork, words: list[str]) -> dict[str, list[str]]:
    """The vocabulary's words one edit from each query word of TYPO_LENGTH letters or more."""
    long_words = [word for word in words if len(word) >= TYPO_LENGTH and word.isalpha()]
    if not long_words:
        return {}
    params: dict[str, Any] = {}
    for n, word in enumerate(long_words):
        head, tail = typo_reach(word)
        params.update({f"length{n}": len(word), f"head{n}": head, f"head_end{n}": head + _LAST,
                       f"tail{n}": tail, f"tail_end{n}": tail + _LAST})
    found = {row[0] for row in tx.execute(_typo_candidates(len(long_words)), params).all()}
    return {word: typos_of(word, found) for word in long_words}


def typo_reach(word: str) -> tuple[str, str]:
    """The first letters, and the last (reversed), of which a word one edit away has either."""
    shared = (len(word) - 1) // 2
    return word[:shared], word[::-1][:shared]


def typos_of(word: str, candidates: set[str]) -> list[str]:
    """The candidates one edit from `word` that it matches: the first TYPOS, in word order."""
    return sorted(other for other in candidates if one_edit_apart(word, other))[:TYPOS]


@functools.cache
def _typo_candidates(word_count: int) -> CompoundSelect:
    """The vocabulary's words of one letter fewer, as many or one more as each query word, that
    share its first or its last letters (_typos): two ranges a length, in two index reads (by
    word, by tail) of at most CANDIDATES rows a query word."""
    def ranges(column: Any, start: str, end: str) -> ColumnElement[bool]:
        return or_(*[(vocabulary.c.length == bindparam(f"length{n}", type_=Integer) + delta)
                     & (column >= bindparam(f"{start}{n}")) & (column < bindparam(f"{end}{n}"))
                     for n in range(word_count) for delta in (-1, 0, 1)])

    return union_all(*[_limited(select(vocabulary.c.word).where(ranges(column, start, end)),
                                CANDIDATES * word_count)
                       for column, start, end in ((vocabulary.c.word, "head", "head_end"),
                                                  (vocabulary.c.tail, "tail", "tail_end"))])


@functools.cache
def _ranked_search(term_count: int, by_category: bool, after_cursor: bool,
                   keywords: bool = False) -> Select[Any]:
    """Items on sale matching any of the terms (_ranked), ranked by the sum over query words
    of each one's best weight, then item_id; the WINDOW first rows of each term's range of
    item_words (or of item_keywords)."""
    index, key = (item_keywords, item_keywords.c.keyword) if keywords else (item_words, item_words.c.word)
    reads = []
    for n in range(term_count):
        on = key == bindparam(f"term{n}", type_=key.type)
        read = select(index.c.item_id, bindparam(f"group{n}", type_=Integer).label("query_word"),
                      bindparam(f"weight{n}", type_=Integer).label("weight"))
        if by_category:  # (word, category, item_id): in item_id order
            on &= index.c.category == bindparam("category")
        else:  # MariaDB would read (word, category, item_id) and sort every match unless told
            read = read.with_hint(index, "FORCE INDEX (PRIMARY)", "mysql")
        reads.append(_limited(read.where(on).order_by(index.c.item_id), "window"))
    hits = union_all(*reads).subquery()
    best = (select(hits.c.item_id, func.max(hits.c.weight).label("weight"))
            .group_by(hits.c.item_id, hits.c.query_word).subquery())
    matches = func.sum(best.c.weight)
    ranked = select(best.c.item_id, matches.label("matches")).group_by(best.c.item_id)
    if after_cursor:
        last_matches: BindParameter[int] = bindparam("last_matches")
        ranked = ranked.having((matches < last_matches)
                               | ((matches == last_matches) & (best.c.item_id > bindparam("after"))))
    return _page_with_items(ranked.order_by(desc("matches"), best.c.item_id))
