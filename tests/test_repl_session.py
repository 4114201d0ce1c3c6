"""The REPL's command parser and state (`engine.repl.session`), without an engine."""

import pytest

from engine.repl.session import Embed, Quit, Rerank, Say, Score, Session, ShowStats
from tests.test_repl_support import fake_encode, ready


@pytest.fixture
def session() -> Session:
    return Session(fake_encode, vocab_size=100)


def test_query_is_set_by_question_mark_or_command(session):
    assert session.handle("? Is Paris in France?") == Say("query: 'Is Paris in France?'")
    assert session.query == "Is Paris in France?"
    session.handle("?no space")
    assert session.query == "no space"
    session.handle(":query  leading space kept")
    assert session.query == " leading space kept"
    with pytest.raises(ValueError, match="query: needs text"):
        session.handle(":query")
    assert session.query == " leading space kept"


def test_plain_lines_are_items_and_backslash_escapes(session):
    for line in [" yes it is", "\\:not a command", "\\?not a query", "\\\\two"]:
        assert session.handle(line) is None
    assert session.items == [" yes it is", ":not a command", "?not a query", "\\two"]
    assert session.prompt() == "score[4]> "


def test_empty_line_scores_pending_items_then_clears_them(session):
    assert ready(session).handle("") is None  # nothing pending: nothing to do
    ready(session, "a", "b")
    assert session.handle("") == Score(
        "the query", ["a", "b"], [5, 7], ["'yes'", "'no'"], False, False
    )
    assert session.items == []
    session.handle("c")
    assert session.handle(":score").items == ["c"]


def test_score_needs_query_items_and_labels(session):
    with pytest.raises(ValueError, match="no query: set one with `\\? text`"):
        session.handle(":score")
    session.handle("? q")
    with pytest.raises(ValueError, match="no items: type one per line"):
        session.handle(":score")
    session.handle("an item")
    with pytest.raises(ValueError, match="no labels: set them with `:labels"):
        session.handle("")
    assert session.items == ["an item"]  # kept: nothing was sent


def test_labels_by_text_quoted_text_and_id(session):
    assert session.handle(':labels yes " no" #42') == Say("labels: 'yes' (#5), ' no' (#8), #42")
    assert session.labels == [("'yes'", 5), ("' no'", 8), ("#42", 42)]
    assert session.handle(":labels") == Say("labels: 'yes' (#5), ' no' (#8), #42")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (":labels yes maybe", r"label 'maybe' is 2 tokens \[9, 10\]; each label must be one token"),
        (":labels #100", r"label #100: outside the vocabulary \[0, 100\)"),
        (":labels #-1", r"outside the vocabulary"),
        (":labels #x", "'#' must be followed by a token id"),
        (':labels "yes', "labels: No closing quotation"),
    ],
)
def test_bad_labels_are_errors_and_keep_the_old_ones(session, line, message):
    session.handle(":labels no")
    with pytest.raises(ValueError, match=message):
        session.handle(line)
    assert session.labels == [("'no'", 7)]


def test_toggles_flip_or_set_and_report_the_new_state(session):
    assert session.handle(":softmax") == Say("softmax: on")
    assert session.handle(":softmax") == Say("softmax: off")
    assert session.handle(":softmax ON") == Say("softmax: on")
    assert session.handle(":item_first") == Say("item_first: on")
    assert session.handle(":item_first off") == Say("item_first: off")
    with pytest.raises(ValueError, match="softmax: expected on or off, got 'maybe'"):
        session.handle(":softmax maybe")
    assert session.softmax
    action = ready(session, "x").handle(":score")
    assert (action.apply_softmax, action.item_first) == (True, False)


def test_rerank_mode_with_instruction_and_top(session):
    assert session.handle(":rerank") == Say("rerank: on")
    assert session.prompt() == "rerank> "
    assert session.handle(":instruction Find answers") == Say("instruction: 'Find answers'")
    assert session.handle(":top 2") == Say("top: 2")
    session.handle("? where")
    session.handle("doc a")
    session.handle("doc b")
    assert session.handle("") == Rerank("where", ["doc a", "doc b"], 2, "Find answers")
    assert session.handle(":top all") == Say("top: all")
    assert session.handle(":instruction") == Say("instruction: (default)")
    session.handle("doc c")
    assert session.handle("") == Rerank("where", ["doc c"], None, None)  # needs no labels
    for bad in [":top 0", ":top -1", ":top x"]:
        with pytest.raises(ValueError, match="top: expected a positive number or 'all'"):
            session.handle(bad)
    assert session.handle(":rerank off") == Say("rerank: off")


def test_embed_mode_ranks_the_items_by_similarity(session):
    session.embed = True  # as `make_session` sets it for an embedder
    session.handle("? where")
    session.handle("doc a")
    assert session.prompt() == "embed[1]> "
    assert session.handle("") == Embed("where", ["doc a"], None)  # needs no labels
    session.handle(":top 3")
    session.handle("doc b")
    assert session.handle("") == Embed("where", ["doc b"], 3)
    with pytest.raises(ValueError, match="rerank: this model embeds"):
        session.handle(":rerank on")
    assert "mode:        embed" in session.handle(":show").text


def test_clear_show_stats_help_quit(session):
    ready(session, "one", "two")
    assert session.handle(":clear") == Say("dropped 2 pending items")
    session.handle("three")
    shown = session.handle(":show").text
    for expected in ["mode:        score", "query:       'the query'", "labels:      'yes' (#5)"]:
        assert expected in shown
    assert "softmax:     off" in shown and "pending:     1 items" in shown
    assert shown.endswith("[0] 'three'")
    assert session.handle(":stats") == ShowStats()
    help_text = session.handle(":help").text
    for name in Session.COMMANDS:
        assert f":{name} " in help_text
    assert "? TEXT" in help_text and "empty line" in help_text
    assert session.handle(":quit") == session.handle(":exit") == session.handle(":q") == Quit()


def test_unique_prefixes_and_unknown_commands(session):
    assert session.handle(":lab yes") == Say("labels: 'yes' (#5)")
    assert session.handle(":so") == Say("softmax: on")
    with pytest.raises(ValueError, match=r":s is ambiguous \(:score, :softmax, :show, :stats\)"):
        session.handle(":s")
    with pytest.raises(ValueError, match=r"unknown command :frobnicate \(:help lists"):
        session.handle(":frobnicate")
    with pytest.raises(ValueError, match=r"unknown command : \(:help"):
        session.handle(":")
