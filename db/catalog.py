"""Items and ratings: listing, pricing, removing, displaying, searching.

Keywords live three times: as the item's JSON list (returned in order, no extra query),
as rows of item_keywords, the search index, and as rows of item_keyword_pairs, every pair
of an item's keywords. Both indexes hold items on sale only: an item's rows go when it
sells out, and come back only if an operator gives it stock again (relist), so ranking
runs on them alone. Search ranks
by matching keywords, then item_id, and pages with a cursor over exactly that order.
A search by text (`query`) runs the same statements on item_words, the folded words of
each item's name and keywords, and item_word_pairs, held like the keyword indexes.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import orjson
from sqlalchemy import (
    BigInteger,
    BindParameter,
    Column,
    ColumnElement,
    CompoundSelect,
    Integer,
    Select,
    Table,
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
from wire.values import MAX_QUERY_WORDS, decode_cursor, encode_cursor, format_money

from .accounts import Session, with_session
from .database import now_ms
from .schema import (
    item_keyword_pairs,
    item_keywords,
    item_word_pairs,
    item_words,
    items,
    keyword_pair_rows,
    keyword_pairs,
    keyword_rows,
    sessions,
    users,
    word_pair_hash,
    word_pair_rows,
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
_INDEX_WORD_PAIRS = insert(item_word_pairs)


def put_item(tx: UnitOfWork, session: Session, name: str, category: int, keywords: list[str],
             condition: str, price: int, quantity: int) -> dict[str, Any]:
    """List a new item for sale."""
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
    words = word_rows(item_id, category, name, keywords)
    if words:  # a name of spaces and punctuation only has none
        tx.execute(_INDEX_WORDS, words)
    if len(words) > 1:
        tx.execute(_INDEX_WORD_PAIRS, word_pair_rows(item_id, [row["word"] for row in words]))


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
           (delete(item_words).where(item_words.c.item_id == bindparam("item_id"))),
           (delete(item_word_pairs).where(item_word_pairs.c.item_id == bindparam("item_id"))))


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
    """Items on sale, by category and/or keywords or the words of a query, best match first.
    A query runs the keyword search's statements on the word indexes (by_words)."""
    terms, by_words = list(query or keywords), bool(query)
    params: dict[str, Any] = {**session.check_params, "category": category, "limit": limit + 1}
    last = decode_cursor(cursor, 2) if cursor and terms else None  # (matches, item_id)
    params.update({f"keyword{n}": word for n, word in enumerate(terms)})
    if len(terms) == 1:
        params["after"] = _after_at_rank(last, 1)
        statement = _one_keyword_search(category is not None, by_words)
    elif len(terms) == 2 and category is None:
        params.update(pair_params(terms, by_words), after_both=_after_at_rank(last, 2),
                      after=_after_at_rank(last, 1))
        statement = _two_keyword_search(by_words)
    elif terms and category is None and last is None:  # three or more: the first page
        params.update(pair_params(terms, by_words))
        statement = _many_keywords_first_page(len(terms), by_words)
    elif terms:
        params.update(last_matches=last and last[0], after=last and last[1])
        statement = _ranked_search(category is not None, last is not None, len(terms), by_words)
    else:
        params["after"] = decode_cursor(cursor, 1)[0] if cursor else 0
        statement = _plain_search(category is not None)
    cursor_of = _rank_cursor if terms else _id_cursor
    rows, next_cursor = split_page(session.accept_rows(tx.execute(statement, params).all()), limit, cursor_of)
    return {"items": [item_to_wire(r) for r in rows], "next_cursor": next_cursor}


def _id_cursor(row: ItemRow) -> str:
    return encode_cursor(row.item_id)


def _rank_cursor(row: ItemRow) -> str:
    return encode_cursor(row.matches, row.item_id)


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
def _one_keyword_search(by_category: bool, by_words: bool = False) -> Select[Any]:
    """Items on sale with one keyword (by_words: one word), by item_id: a range of the index
    read in order, stopped by the LIMIT, where counting matches would group and sort every match."""
    index, key = _search_index(by_words)
    on = (key == _keyword(0, key)) & (index.c.item_id > bindparam("after"))
    ranked = select(index.c.item_id, literal_column("1", Integer).label("matches"))
    if by_category:  # (keyword, category, item_id): in item_id order
        on &= index.c.category == bindparam("category")
    else:  # MariaDB reads (keyword, category, item_id) by keyword and sorts every match unless told
        ranked = ranked.with_hint(index, "FORCE INDEX (PRIMARY)", "mysql")  # mariadb:// too
    return _page_with_items(ranked.where(on).order_by(index.c.item_id))


def _search_index(by_words: bool) -> tuple[Table, Column[str]]:
    """The index a search reads, and its column of words: item_words, or item_keywords."""
    return (item_words, item_words.c.word) if by_words else (item_keywords, item_keywords.c.keyword)


@functools.cache
def _two_keyword_search(by_words: bool = False) -> Select[Any]:
    """Items on sale with either of two keywords, those with both first, then by item_id.

    Three index ranges read in item order, each stopped by the LIMIT: the pair's (rank 2),
    and each keyword's without the items that have the other (rank 1), where counting
    matches would group and sort every item with either keyword. With a category the
    grouped statement reads a tenth of that and was faster at 1,000 and 1,000,000 items
    (docs/benchmarks.md, Catalogue growth), so this one is for searches without.
    """
    both = _pair_index(by_words)
    on = _pair(0, by_words) & (both.c.item_id > bindparam("after_both"))
    # FORCE INDEX: as with one keyword, MariaDB would read the category index and sort every match
    ranked = (select(both.c.item_id, literal_column("2", Integer).label("matches"))
              .with_hint(both, "FORCE INDEX (PRIMARY)", "mysql"))
    pages = [_limited(ranked.where(on).order_by(both.c.item_id)), _only_keyword(0, 1, by_words),
             _only_keyword(1, 0, by_words)]
    return _page_with_items(union_all(*pages).order_by(desc("matches"), "item_id"))


def _only_keyword(n: int, other: int, by_words: bool = False) -> Select[Any]:
    """One page of the items on sale with keyword (word) n and not `other`, by item_id."""
    index, key = _search_index(by_words)
    mine, theirs = index.alias(f"keyword{n}"), index.alias(f"keyword{other}")
    without = mine.outerjoin(theirs, (theirs.c[key.name] == _keyword(other, key))
                             & (theirs.c.item_id == mine.c.item_id))
    on = (mine.c[key.name] == _keyword(n, key)) & (mine.c.item_id > bindparam("after")) \
        & theirs.c.item_id.is_(None)
    ranked = (select(mine.c.item_id, literal_column("1", Integer).label("matches")).select_from(without)
              .with_hint(mine, "FORCE INDEX (PRIMARY)", "mysql")
              .with_hint(theirs, "FORCE INDEX (PRIMARY)", "mysql"))  # one row's look-up, not the range
    return _limited(ranked.where(on).order_by(mine.c.item_id))


def _limited(ranked: Select[Any]) -> Select[Any]:
    """A query cut to one page, wrapped so that it can stand in a UNION (SQLite too)."""
    page = ranked.limit(bindparam("limit", type_=Integer)).subquery()
    return select(*page.c)


# An item with m of the terms has m(m-1)/2 of their pairs: its rank from its pair count.
_RANK_OF_PAIR_COUNT = {m * (m - 1) // 2: m for m in range(1, MAX_QUERY_WORDS + 1)}


def pair_params(terms: list[str], by_words: bool = False) -> dict[str, Any]:
    """The parameters of the terms' pairs on the pair index (_pair): first0, second0, ...
    for keywords, pair0, ... (word_pair_hash) for words."""
    params: dict[str, Any] = {}
    for n, (first, second) in enumerate(keyword_pairs(terms)):
        params.update({f"pair{n}": word_pair_hash(first, second)} if by_words
                      else {f"first{n}": first, f"second{n}": second})
    return params


def _pair_index(by_words: bool) -> Table:
    return item_word_pairs if by_words else item_keyword_pairs


def _pair(n: int, by_words: bool = False) -> ColumnElement[bool]:
    """The pair index's rows of the terms' pair n (pair_params)."""
    if by_words:
        return item_word_pairs.c.pair_hash == bindparam(f"pair{n}", type_=BigInteger)
    pair, pair_type = item_keyword_pairs, item_keyword_pairs.c.first_keyword.type
    return and_(pair.c.first_keyword == bindparam(f"first{n}", type_=pair_type),
                pair.c.second_keyword == bindparam(f"second{n}", type_=pair_type))


@functools.cache
def _many_keywords_first_page(keyword_count: int, by_words: bool = False) -> Select[Any]:
    """The first page of a search of three to five keywords (by_words: 3-8 words) without a category.

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
    index, key = _search_index(by_words)
    ranges = [_limited(select(index.c.item_id, literal_column("0", Integer).label("pairs"))
                       .with_hint(index, "FORCE INDEX (PRIMARY)", "mysql")  # item order, as above
                       .where(key == _keyword(n, key)).order_by(index.c.item_id))
              for n in range(keyword_count)]
    wanted = [_pair(n, by_words) for n in range(keyword_count * (keyword_count - 1) // 2)]
    pairs = (select(_pair_index(by_words).c.item_id, literal_column("1", Integer).label("pairs"))
             .where(or_(*wanted)))  # OR, not a row IN: SQLite scans the table for that
    hits = union_all(*ranges, pairs).subquery()
    matches = case(_RANK_OF_PAIR_COUNT, value=func.sum(hits.c.pairs)).label("matches")
    ranked = select(hits.c.item_id, matches).group_by(hits.c.item_id)
    return _page_with_items(ranked.order_by(desc(matches), hits.c.item_id))


@functools.cache
def _ranked_search(by_category: bool, after_cursor: bool, keyword_count: int,
                   by_words: bool = False) -> Select[Any]:
    """Items on sale with any of the keywords (by_words: words), most matches first, then item_id.

    The page is ranked and cut on the index alone (integers only, so MariaDB's temporary
    table stays in memory); only then are its items read and joined. Each item has a word
    or keyword once in its index, so its count is the number of distinct terms it matches.
    """
    index, key = _search_index(by_words)
    matches = func.count().label("matches")
    ranked = (select(index.c.item_id, matches)
              .where(key.in_([_keyword(n, key) for n in range(keyword_count)]))
              .group_by(index.c.item_id))
    if by_category:
        ranked = ranked.where(index.c.category == bindparam("category"))
    if after_cursor:
        last_matches: BindParameter[int] = bindparam("last_matches")
        ranked = ranked.having((func.count() < last_matches)
                               | ((func.count() == last_matches)
                                  & (index.c.item_id > bindparam("after"))))
    return _page_with_items(ranked.order_by(desc(matches), index.c.item_id))


def _keyword(n: int, key: Column[str] = item_keywords.c.keyword) -> BindParameter[str]:
    return bindparam(f"keyword{n}", type_=key.type)


def _page_with_items(ranked: Select[Any] | CompoundSelect) -> Select[Any]:
    """A ranked (item_id, matches) query cut to one page, then joined to its items on sale."""
    page = ranked.limit(bindparam("limit", type_=Integer)).subquery()
    found = page.join(items, items.c.item_id == page.c.item_id)
    query = with_session(*ITEM_COLUMNS, page.c.matches, joined=found, on=items.c.quantity > 0)
    return (query.order_by(desc(page.c.matches), page.c.item_id))


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
