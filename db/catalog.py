"""Items and ratings: listing, pricing, removing, displaying, searching.

Keywords live three times: as the item's JSON list (returned in order, no extra query),
as rows of item_keywords, the search index, and as rows of item_keyword_pairs, every pair
of an item's keywords. Both indexes hold items on sale only: an item's rows go when it
sells out, and come back only if an operator gives it stock again (relist), so ranking
runs on them alone. Search ranks
by matching keywords, then item_id, and pages with a cursor over exactly that order.
A search by text (`query`) reads item_words, the words of each item on sale (held like the
keyword index), and the vocabulary for typos: see _search_by_text.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import orjson
from sqlalchemy import (
    BindParameter,
    ColumnElement,
    CompoundSelect,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    delete,
    desc,
    func,
    insert,
    literal_column,
    or_,
    select,
    union_all,
    update,
)

from wire.errors import ConflictError, ForbiddenError, NotFoundError
from wire.values import TYPO_LENGTH, decode_cursor, encode_cursor, format_money, one_edit_apart, stem

from .accounts import Session, with_session
from .database import now_ms
from .schema import (
    item_keyword_pairs,
    item_keywords,
    item_words,
    items,
    keyword_pair_rows,
    keyword_pairs,
    keyword_rows,
    sessions,
    users,
    vocabulary,
    vocabulary_rows,
    word_rows,
)
from .unit_of_work import UnitOfWork

ItemRow = Any  # a Row with ITEM_COLUMNS (SQLAlchemy types rows by column count)
ITEM_COLUMNS = (items.c.item_id, items.c.seller_id, items.c.name, items.c.category, items.c.keywords,
                items.c.item_condition, items.c.price_cents, items.c.quantity, items.c.thumbs_up,
                items.c.thumbs_down)


def item_to_wire(row: ItemRow) -> dict[str, Any]:
    """An item row as the protocol's item object."""
    return {"item_id": row.item_id, "seller_id": row.seller_id, "name": row.name,
            "category": row.category, "keywords": orjson.loads(row.keywords),
            "condition": row.item_condition, "price": format_money(row.price_cents),
            "quantity": row.quantity, "thumbs_up": row.thumbs_up, "thumbs_down": row.thumbs_down}


def split_page(rows: Sequence[Any], limit: int, cursor_of: Any) -> tuple[Sequence[Any], str | None]:
    """Rows of one page and the cursor of the next (None on the last page)."""
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, cursor_of(rows[-1])


_NEW_ITEM = (insert(items).values(
    seller_id=bindparam("seller_id"), name=bindparam("name"), category=bindparam("category"),
    keywords=bindparam("keywords"), item_condition=bindparam("condition"), price_cents=bindparam("price"),
    quantity=bindparam("quantity"), listed=bindparam("quantity"), created_ms=bindparam("now")))
_INDEX_KEYWORDS = insert(item_keywords)
_INDEX_PAIRS = insert(item_keyword_pairs)
_INDEX_WORDS = insert(item_words)
# (the seed and the upgrade write it too: words already there are kept)
INDEX_VOCABULARY = (insert(vocabulary).prefix_with("OR IGNORE", dialect="sqlite")
                     .prefix_with("IGNORE", dialect="mysql").prefix_with("IGNORE", dialect="mariadb"))
MAX_ITEMS_PER_SELLER = 10_000  # items on sale at once (MARKET_MAX_ITEMS_PER_SELLER)
_ON_SALE = select(func.count()).select_from(
    select(items.c.item_id).where(items.c.seller_id == bindparam("seller_id"), items.c.quantity > 0)
    .limit(bindparam("cap", type_=Integer)).subquery())  # ix_items_seller_on_sale: at most `cap` keys


def put_item(tx: UnitOfWork, session: Session, name: str, category: int, keywords: list[str],
             condition: str, price: int, quantity: int, *,
             max_on_sale: int = MAX_ITEMS_PER_SELLER) -> dict[str, Any]:
    """List a new item for sale, unless the seller has max_on_sale items on sale already."""
    if tx.execute(_ON_SALE, {"seller_id": session.user_id, "cap": max_on_sale}).scalar() >= max_on_sale:
        raise ConflictError(f"you have {max_on_sale:,} items on sale, the most a seller may have on this "
                            "market; remove some (or wait for them to sell) before listing more")
    item_id = int(tx.execute(_NEW_ITEM, {
        "seller_id": session.user_id, "name": name, "category": category, "keywords": json.dumps(keywords),
        "condition": condition, "price": price, "quantity": quantity, "now": now_ms()}).lastrowid)
    _index(tx, item_id, category, name, keywords)
    return {"item_id": item_id}


def _index(tx: UnitOfWork, item_id: int, category: int, name: str, keywords: list[str]) -> None:
    """An item's rows of the search indexes (held for the COMMIT: nothing reads them back)."""
    if keywords:
        tx.execute(_INDEX_KEYWORDS, keyword_rows(item_id, category, keywords))
    if len(keywords) > 1:
        tx.execute(_INDEX_PAIRS, keyword_pair_rows(item_id, keywords))
    words = word_rows(item_id, category, name, keywords)  # the category's name at least
    tx.execute(_INDEX_WORDS, words)
    for word in vocabulary_rows(row["word"] for row in words):  # a row a statement: each keeps IGNORE
        tx.execute(INDEX_VOCABULARY, word)


_OWN_ITEM = (with_session(*ITEM_COLUMNS, joined=items, on=items.c.item_id == bindparam("item_id"))
                     .with_for_update())


def _own_item(tx: UnitOfWork, session: Session, item_id: int) -> ItemRow:
    """One of the caller's items, locked until the transaction ends (the token check folded in)."""
    rows = session.accept_rows(tx.execute(_OWN_ITEM, {**session.check_params, "item_id": item_id}).all())
    if not rows:
        raise NotFoundError(f"no item {item_id}")
    if rows[0].seller_id != session.user_id:
        raise ForbiddenError(f"item {item_id} belongs to another seller")
    return rows[0]


_SET_PRICE = (update(items).where(items.c.item_id == bindparam("item_id"))
                      .values(price_cents=bindparam("price")))
_REMOVE = (update(items)
                   .where(items.c.item_id == bindparam("item_id"), items.c.quantity >= bindparam("n"))
                   .values(quantity=items.c.quantity - bindparam("n"),
                           removed=items.c.removed + bindparam("n")))


def change_price(tx: UnitOfWork, session: Session, item_id: int, price: int) -> dict[str, Any]:
    """Set a new price on one of the seller's items."""
    row = _own_item(tx, session, item_id)
    tx.execute(_SET_PRICE, {"item_id": item_id, "price": price})
    return {**item_to_wire(row), "price": format_money(price)}  # the row is locked: nothing else moved


def remove_item(tx: UnitOfWork, session: Session, item_id: int, quantity: int) -> dict[str, Any]:
    """Take units of one of the seller's items off sale."""
    row = _own_item(tx, session, item_id)
    if row.quantity < quantity:
        raise ConflictError(f"item {item_id}: only {row.quantity} on sale, cannot remove {quantity}")
    # The row is locked: its quantity is the one read (the UPDATE's condition says so again),
    # so its row count need not be read, and the UPDATE goes with the COMMIT.
    tx.execute(_REMOVE, {"item_id": item_id, "n": quantity})
    if row.quantity == quantity:
        unlist(tx, [item_id])
    return {**item_to_wire(row), "quantity": row.quantity - quantity}


_UNLIST = ((delete(item_keywords).where(item_keywords.c.item_id == bindparam("item_id"))),
           (delete(item_keyword_pairs).where(item_keyword_pairs.c.item_id == bindparam("item_id"))),
           (delete(item_words).where(item_words.c.item_id == bindparam("item_id"))))


def unlist(tx: UnitOfWork, sold_out: Sequence[int]) -> None:
    """Take sold-out items out of the search indexes (see the module docstring)."""
    for item_id in sold_out:
        for statement in _UNLIST:
            tx.execute(statement, {"item_id": item_id})


def relist(tx: UnitOfWork, restocked: Sequence[ItemRow]) -> None:
    """Put items whose quantity rose from 0 back in the search indexes (rows with item_id,
    category, name and keywords)."""
    for item in restocked:
        _index(tx, item.item_id, item.category, item.name, json.loads(item.keywords))


_SELLER_ITEMS = (
    with_session(*ITEM_COLUMNS, joined=items,
                 on=(items.c.seller_id == sessions.c.user_id) & (items.c.item_id > bindparam("after"))
                 & (items.c.quantity > 0))
    .order_by(items.c.item_id).limit(bindparam("limit", type_=Integer)))


def display_items(tx: UnitOfWork, session: Session, limit: int, cursor: str | None) -> dict[str, Any]:
    """The seller's items still on sale, by item_id."""
    after = decode_cursor(cursor, 1)[0] if cursor else 0
    params = {**session.check_params, "after": after, "limit": limit + 1}
    rows = session.accept_rows(tx.execute(_SELLER_ITEMS, params).all())
    rows, next_cursor = split_page(rows, limit, lambda r: encode_cursor(r.item_id))
    return {"items": [item_to_wire(r) for r in rows], "next_cursor": next_cursor}


_ITEM_AND_SESSION = with_session(*ITEM_COLUMNS, joined=items, on=items.c.item_id == bindparam("item_id"))
_ITEM_FOR_SESSION = (_ITEM_AND_SESSION)
_ITEM_FOR_SESSION_LOCKED = (_ITEM_AND_SESSION.with_for_update())


def get_item(tx: UnitOfWork, session: Session, item_id: int) -> dict[str, Any]:
    """One item, also when sold out."""
    return item_to_wire(item_for_session(tx, session, item_id))


def item_for_session(tx: UnitOfWork, session: Session, item_id: int, lock: bool = False) -> ItemRow:
    """One item row, or NOT_FOUND, with the token check in the same query; `lock`: FOR UPDATE."""
    statement = _ITEM_FOR_SESSION_LOCKED if lock else _ITEM_FOR_SESSION
    rows = session.accept_rows(tx.execute(statement, {**session.check_params, "item_id": item_id}).all())
    if not rows:
        raise NotFoundError(f"no item {item_id}")
    return rows[0]


def search_items(tx: UnitOfWork, session: Session, category: int | None, keywords: list[str],
                 limit: int, cursor: str | None, query: Sequence[str] = ()) -> dict[str, Any]:
    """Items on sale, by category and/or keywords or the words of a query, best match first."""
    terms = list(keywords)
    params: dict[str, Any] = {**session.check_params, "category": category, "limit": limit + 1}
    last = decode_cursor(cursor, 2) if cursor and (terms or query) else None  # (matches, item_id)
    params.update({f"keyword{n}": word for n, word in enumerate(terms)})
    if query:
        statement = _search_by_text(tx, list(query), params, category is not None, last)
    elif len(terms) == 1:
        params["after"] = _after_at_rank(last, 1)
        statement = _one_keyword_search(category is not None)
    elif len(terms) == 2 and category is None:
        params.update(pair_params(terms), after_both=_after_at_rank(last, 2), after=_after_at_rank(last, 1))
        statement = _two_keyword_search()
    elif terms and category is None and last is None:  # three or more: the first page
        params.update(pair_params(terms))
        statement = _many_keywords_first_page(len(terms))
    elif terms:
        params.update(last_matches=last and last[0], after=last and last[1])
        statement = _ranked_search(category is not None, last is not None, len(terms))
    else:
        params["after"] = decode_cursor(cursor, 1)[0] if cursor else 0
        statement = _plain_search(category is not None)
    cursor_of = _rank_cursor if terms or query else _id_cursor
    rows, next_cursor = split_page(session.accept_rows(tx.execute(statement, params).all()), limit, cursor_of)
    return {"items": [item_to_wire(r) for r in rows], "next_cursor": next_cursor}


def _id_cursor(row: ItemRow) -> str:
    return encode_cursor(row.item_id)


def _rank_cursor(row: ItemRow) -> str:
    return encode_cursor(int(row.matches), row.item_id)  # MariaDB's SUM is a DECIMAL


@functools.cache
def _plain_search(by_category: bool) -> Select[Any]:
    """Items on sale after a cursor, by item_id (with the caller's session)."""
    on = (items.c.quantity > 0) & (items.c.item_id > bindparam("after"))
    if by_category:
        on &= items.c.category == bindparam("category")
    query = with_session(*ITEM_COLUMNS, joined=items, on=on)
    return (query.order_by(items.c.item_id).limit(bindparam("limit", type_=Integer)))


_AFTER_EVERYTHING = 2**63 - 1  # past the largest BIGINT: a cursor below rank 1 has nothing after it


def _after_at_rank(last: tuple[int, ...] | None, rank: int) -> int:
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
    grouped statement reads a tenth of that and was faster at 1,000 and 1,000,000 items
    (docs/benchmarks.md, Catalogue growth), so this one is for searches without.
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
_RANK_OF_PAIR_COUNT = {m * (m - 1) // 2: m for m in range(1, 6)}


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


@functools.cache
def _many_keywords_first_page(keyword_count: int) -> Select[Any]:
    """The first page of a search of three to five keywords without a category.

    Every item with two or more of the keywords is on the pair index, so its rank is counted
    there from a few short ranges (the pairs' rows), where counting it on the keyword index
    would group and sort every item with any of the keywords. The items with one keyword are
    read from each keyword's range in item order, stopped at the page's length L (`limit`,
    which is the page plus one). That is enough: with P < L items of rank two or more, the
    page's rank-one items are the smallest L - P of them, and before each, its keyword's
    range holds fewer than L - P rank-one items and at most P others, so it lies in the
    first L rows (with P >= L the page has none). Pages after the first keep the grouped
    statement: there the items of rank two or more shown before could fill any such prefix
    (docs/benchmarks.md, Catalogue growth, measured reading L + P there).
    """
    index = item_keywords
    ranges = [_limited(select(index.c.item_id, literal_column("0", Integer).label("pairs"))
                       .with_hint(index, "FORCE INDEX (PRIMARY)", "mysql")  # item order, as above
                       .where(index.c.keyword == _keyword(n)).order_by(index.c.item_id))
              for n in range(keyword_count)]
    wanted = [_pair(n) for n in range(keyword_count * (keyword_count - 1) // 2)]
    pairs = (select(item_keyword_pairs.c.item_id, literal_column("1", Integer).label("pairs"))
             .where(or_(*wanted)))  # OR, not a row IN: SQLite scans the table for that
    hits = union_all(*ranges, pairs).subquery()
    matches = case(_RANK_OF_PAIR_COUNT, value=func.sum(hits.c.pairs)).label("matches")
    ranked = select(hits.c.item_id, matches).group_by(hits.c.item_id)
    return _page_with_items(ranked.order_by(desc(matches), hits.c.item_id))


@functools.cache
def _ranked_search(by_category: bool, after_cursor: bool, keyword_count: int) -> Select[Any]:
    """Items on sale with any of the keywords, most matches first, then item_id.

    The page is ranked and cut on the index alone (integers only, so MariaDB's temporary
    table stays in memory); only then are its items read and joined. Each item has a word
    or keyword once in its index, so its count is the number of distinct terms it matches.
    """
    index = item_keywords
    matches = func.count().label("matches")
    ranked = (select(index.c.item_id, matches)
              .where(index.c.keyword.in_([_keyword(n) for n in range(keyword_count)]))
              .group_by(index.c.item_id))
    if by_category:
        ranked = ranked.where(index.c.category == bindparam("category"))
    if after_cursor:
        last_matches: BindParameter[int] = bindparam("last_matches")
        ranked = ranked.having((func.count() < last_matches)
                               | ((func.count() == last_matches)
                                  & (index.c.item_id > bindparam("after"))))
    return _page_with_items(ranked.order_by(desc(matches), index.c.item_id))


def _keyword(n: int) -> BindParameter[str]:
    return bindparam(f"keyword{n}", type_=item_keywords.c.keyword.type)


def _page_with_items(ranked: Select[Any] | CompoundSelect) -> Select[Any]:
    """A ranked (item_id, matches) query cut to one page, then joined to its items on sale."""
    page = ranked.limit(bindparam("limit", type_=Integer)).subquery()
    found = page.join(items, items.c.item_id == page.c.item_id)
    query = with_session(*ITEM_COLUMNS, page.c.matches, joined=found, on=items.c.quantity > 0)
    return (query.order_by(desc(page.c.matches), page.c.item_id))


# Search by text. A query word's terms are the words of item_words it matches, each with a
# weight: itself (EXACT), its stem and "~" + its stem (STEM: item words sharing the stem), and
# up to TYPOS words of the vocabulary one edit away (EDIT). An item's rank is the sum, over the
# query words it matches, of the best weight: a word matched (81) outweighs any number of
# exact matches (9 each above 81) beyond it, and those any number of stems (1 each).
EXACT, STEM, EDIT = 90, 82, 81
TYPOS = 2  # vocabulary words matched per query word by one edit (the first in their order)
WINDOW = 250  # items read of each term's range, in item order: a search's work is bounded
CANDIDATES = 50  # vocabulary words read of each of a typo's ranges
_LAST = "\U0010ffff"  # after every letter: a prefix's range ends at prefix + _LAST


def _search_by_text(tx: UnitOfWork, words: list[str], params: dict[str, Any], by_category: bool,
                    last: tuple[int, ...] | None) -> Select[Any]:
    """The ranked statement of a query (see query_terms), its parameters added to params.

    Each term's range of item_words is read in item order, at most WINDOW rows: the ranking
    runs over those (every match while a term has WINDOW items or fewer; else its first
    WINDOW), so that no query reads more than WINDOW rows a term whatever the catalogue."""
    terms = query_terms(words, _typos(tx, words))
    for n, (word, group, weight) in enumerate(terms):
        params.update({f"term{n}": word, f"group{n}": group, f"weight{n}": weight})
    params.update(window=WINDOW, last_matches=last and last[0], after=last and last[1])
    return _text_search(len(terms), by_category, last is not None)


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
        shared = (len(word) - 1) // 2  # a word one edit away starts or ends with this many of its letters
        head, tail = word[:shared], word[::-1][:shared]
        params.update({f"length{n}": len(word), f"head{n}": head, f"head_end{n}": head + _LAST,
                       f"tail{n}": tail, f"tail_end{n}": tail + _LAST})
    found = {row[0] for row in tx.execute(_typo_candidates(len(long_words)), params).all()}
    return {word: sorted(other for other in found if one_edit_apart(word, other))[:TYPOS]
            for word in long_words}


@functools.cache
def _typo_candidates(word_count: int) -> CompoundSelect:
    """The vocabulary's words of one letter fewer, as many or one more as each query word, that
    share its first or its last letters (_typos): two ranges a length, CANDIDATES rows each."""
    reads = []
    for n in range(word_count):
        for column, start, end in ((vocabulary.c.word, f"head{n}", f"head_end{n}"),
                                   (vocabulary.c.tail, f"tail{n}", f"tail_end{n}")):
            for delta in (-1, 0, 1):
                on = ((vocabulary.c.length == bindparam(f"length{n}", type_=Integer) + delta)
                      & (column >= bindparam(start)) & (column < bindparam(end)))
                reads.append(_limited(select(vocabulary.c.word).where(on).order_by(column), CANDIDATES))
    return union_all(*reads)


@functools.cache
def _text_search(term_count: int, by_category: bool, after_cursor: bool) -> Select[Any]:
    """Items on sale matching any of the terms (query_terms), ranked by the sum over query words
    of each one's best weight, then item_id; the WINDOW first rows of each term's range."""
    reads = []
    for n in range(term_count):
        on = item_words.c.word == bindparam(f"term{n}", type_=item_words.c.word.type)
        read = select(item_words.c.item_id, bindparam(f"group{n}", type_=Integer).label("query_word"),
                      bindparam(f"weight{n}", type_=Integer).label("weight"))
        if by_category:  # (word, category, item_id): in item_id order
            on &= item_words.c.category == bindparam("category")
        else:  # MariaDB would read (word, category, item_id) and sort every match unless told
            read = read.with_hint(item_words, "FORCE INDEX (PRIMARY)", "mysql")
        reads.append(_limited(read.where(on).order_by(item_words.c.item_id), "window"))
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


_RATING_FOR_SESSION = (with_session(
    users.c.user_id, users.c.thumbs_up, users.c.thumbs_down, users.c.items_sold, joined=users,
    on=(users.c.user_id == func.coalesce(bindparam("seller_id", type_=Integer), sessions.c.user_id))
    & (users.c.role == "seller")))


def _rating_to_wire(seller_id: int, row: Any) -> dict[str, Any]:
    return {"seller_id": seller_id, "thumbs_up": row.thumbs_up, "thumbs_down": row.thumbs_down,
            "items_sold": row.items_sold}


def get_seller_rating(tx: UnitOfWork, session: Session, seller_id: int | None = None) -> dict[str, Any]:
    """The rating of the given seller, or of the calling seller (one query with the token check)."""
    params = {**session.check_params, "seller_id": seller_id}
    rows = session.accept_rows(tx.execute(_RATING_FOR_SESSION, params).all())
    if not rows:
        raise NotFoundError(f"no seller {seller_id if seller_id is not None else session.user_id}")
    return _rating_to_wire(rows[0].user_id, rows[0])
