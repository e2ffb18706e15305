"""The recipe parser: the Dockerfile subset, its steps' contexts (what their cache keys change with),
and refusals that name their line."""

from __future__ import annotations

import pytest

from corral.images.config import ImageConfig
from corral.images.recipe import MAX_RECIPE_BYTES, RecipeError, parse

RECIPE = """\
# a comment
FROM debian:bookworm
ENV A=1 B="two words"
RUN apt-get update && \\
    # a comment inside a continuation
    apt-get install -y jq
WORKDIR /app
COPY --chown=user:user src/ ./src/
USER user
RUN ["python3", "-c", "print('hi')"]
CMD python3 -m http.server 8000
HEALTHCHECK CMD curl -fs localhost:8000
LABEL a=b
"""


def test_a_recipe_becomes_its_steps_and_config() -> None:
    recipe = parse(RECIPE)
    assert recipe.base == "debian:bookworm"
    kinds = [(s.kind, s.line) for s in recipe.steps]
    assert kinds == [("run", 4), ("workdir", 7), ("copy", 8), ("run", 10)]
    first, workdir, copy, last = recipe.steps
    assert first.command == "apt-get update && apt-get install -y jq"
    assert first.context.user == "root" and first.context.workdir == "/"
    assert dict(first.context.env) == {"A": "1", "B": "two words"}
    assert workdir.dest == "/app"
    assert copy.sources == ("src",) and copy.dest == "/app/src/" and copy.owner == "user:user"
    assert last.command == "python3 -c 'print('\"'\"'hi'\"'\"')'"
    assert last.context.user == "user" and last.context.workdir == "/app"
    config = recipe.config_over()
    assert config.user == "user" and config.workdir == "/app"
    assert config.start_cmd == "python3 -m http.server 8000"
    assert config.ready_cmd == "curl -fs localhost:8000"


def test_a_steps_key_changes_with_what_it_runs_with_not_its_line() -> None:
    a = parse("FROM debian:bookworm\nRUN make\n").steps[0]
    b = parse("FROM debian:bookworm\n\n\nRUN make\n").steps[0]
    c = parse("FROM debian:bookworm\nENV X=1\nRUN make\n").steps[0]
    d = parse("FROM debian:bookworm\nUSER user\nRUN make\n").steps[0]
    assert a.key_text() == b.key_text()
    assert len({a.key_text(), c.key_text(), d.key_text()}) == 3


def test_the_config_of_a_template_base_stands_where_the_recipe_says_nothing() -> None:
    base = ImageConfig(env={"A": "base", "K": "kept"}, user="app", start_cmd="serve")
    config = parse("FROM mytemplate\nENV A=mine\nRUN true\n").config_over(base)
    assert config.env == {"A": "mine", "K": "kept"}
    assert config.user == "app" and config.start_cmd == "serve"
    assert parse("FROM x\n").config_over() == ImageConfig()


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("RUN true\n", 1, "starts with FROM"),
        ("", 0, "needs FROM"),
        ("FROM a\nFROM b\n", 2, "one FROM"),
        ("FROM a b\n", 1, "one base"),
        ("FROM a\nADD x /x\n", 2, "ADD is not supported"),
        ("FROM a\nCOPY ../etc/passwd /x\n", 2, "inside the build context"),
        ("FROM a\nCOPY /etc/passwd /x\n", 2, "inside the build context"),
        ("FROM a\nCOPY x/../../y /x\n", 2, "inside the build context"),
        ("FROM a\nCOPY onlyone\n", 2, "sources and a destination"),
        ("FROM a\nCOPY --from=b x /x\n", 2, "option not supported"),
        ("FROM a\nENV 1BAD=x\n", 2, "not an environment variable"),
        ("FROM a\nENV A\n", 2, "has no value"),
        ("FROM a\nRUN\n", 2, "empty"),
        ("FROM a\nRUN [1, 2]\n", 2, "list of strings"),
        ("FROM a\nRUN [oops\n", 2, "list of strings"),
        ("FROM a\nUSER ../../root\n", 2, "not a user"),
        ("FROM a\nENTRYPOINT x\n", 2, "ENTRYPOINT"),
        ("FROM a\nVOLUME /x\n", 2, "unknown instruction"),
        ("FROM a\nHEALTHCHECK --interval=1s CMD x\n", 2, "HEALTHCHECK"),
    ],
)
def test_a_recipe_that_cannot_be_built_is_refused_at_its_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(RecipeError) as caught:
        parse(text)
    assert caught.value.line == line
    assert fragment in caught.value.message


def test_size_and_step_count_are_bounded() -> None:
    with pytest.raises(RecipeError, match="larger than"):
        parse("FROM a\n" + "#" * MAX_RECIPE_BYTES)
    with pytest.raises(RecipeError, match="at most"):
        parse("FROM a\n" + "RUN true\n" * 201)
