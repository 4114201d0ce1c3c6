"""The generated references: the configuration (`docs/configuration.md`: every field of
`EngineConfig` and of the server's `ServerConfig`, its `SCORING_*` variable, its default and the
comments beside it in the source) and the HTTP routes (`docs/http-reference.md`, from the route
table). `python docs/_hooks/reference.py` writes both; `tests/test_docs.py` fails when a committed
page is not what this generates."""

import ast
import inspect
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
HEAD = """# Configuration reference

Generated from `engine/config.py` (`EngineConfig`) and `api/settings.py` (`ServerConfig`) by
`python docs/_hooks/reference.py`; the suite fails when this page is out of date.

`EngineConfig(...)` and `open_engine` take the engine's fields; the HTTP service reads every field
of both from its `SCORING_*` variable at start (`SCORING_TOKEN_BUDGET` for `token_budget`).
Tuples are comma-separated; an empty value of an optional field is None; booleans are
1/0/true/false. An unknown `SCORING_*` variable is logged and ignored; a wrong value stops the
start with an error naming the variable.
"""


def fields(cls) -> list[tuple[str, str, str, str]]:
    """(name, type, default, comment) of each field of the module-level Struct `cls`, from its
    source."""
    source = inspect.getsource(cls)
    text = source.splitlines()
    out = []
    for node in ast.parse(source).body[0].body:
        if not isinstance(node, ast.AnnAssign):
            continue
        comment = _above(text, node.lineno - 1) + _beside(text, node.lineno - 1)
        kind = ast.get_source_segment(source, node.annotation)
        default = _default(cls, node.target.id, ast.get_source_segment(source, node.value))
        out.append((node.target.id, kind, default, " ".join(comment)))
    return out


def _above(text: list[str], at: int) -> list[str]:
    comment = []
    for line in reversed(text[:at]):
        if not line.strip().startswith("#"):
            break
        comment.insert(0, line.strip().lstrip("#").strip())
    return comment


def _beside(text: list[str], at: int) -> list[str]:
    _, hash_, rest = text[at].partition("  # ")
    return [rest.strip()] if hash_ else []


def _default(cls, name: str, source: str) -> str:
    """A named constant's value (`DEFAULT_TOKEN_BUDGET`: 16384); an expression as written (its
    value differs by machine); a factory's name."""
    if source.startswith("msgspec.field(default_factory="):
        return "computed at start: " + source.removeprefix("msgspec.field(default_factory=")[:-1]
    if source.isidentifier() and source not in ("None", "True", "False"):
        return repr(getattr(cls(), name))
    return source


def table(cls, title: str) -> str:
    rows = [f"## {title}", "", "| field | variable | type | default | meaning |"]
    rows.append("| --- | --- | --- | --- | --- |")
    for name, kind, default, comment in fields(cls):
        cell = lambda s: s.replace("|", "\\|")
        rows.append(
            f"| `{name}` | `SCORING_{name.upper()}` | `{cell(kind)}` | `{cell(default)}` "
            f"| {cell(comment)} |"
        )
    return "\n".join(rows)


def page() -> str:
    from api.settings import ServerConfig
    from engine import EngineConfig

    return "\n".join(
        [
            HEAD,
            table(EngineConfig, "The engine (`EngineConfig`)"),
            "",
            table(ServerConfig, "The server (`ServerConfig`)"),
            "",
        ]
    )


# -- the HTTP reference ---------------------------------------------------------------------------

HTTP_PAGE = ROOT / "docs" / "http-reference.md"
HTTP_HEAD = """# HTTP reference

Generated from the route table (`api.routes.ENDPOINTS`, the source of `/openapi.json`) by
`python docs/_hooks/reference.py`; the suite fails when this page is out of date. What each
route does, with examples: [HTTP service](http.md).
"""


def type_of(schema: dict, components: dict) -> str:
    """A JSON schema in a few words: `string`, `integer ≥ 1`, `[string]`, `A | null`, a `Ref`."""
    if "$ref" in schema:
        return schema["$ref"].rpartition("/")[2]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " \\| ".join(type_of(s, components) for s in schema[key])
    if "enum" in schema:
        return " \\| ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"[{type_of(schema.get('items', {}), components)}]"
    bounds = [f"≥ {schema[k]}" for k in ("minimum", "minLength", "minItems") if k in schema]
    return " ".join([kind, *bounds])


def _fields_table(name: str, components: dict) -> list[str]:
    schema = components[name]
    if "properties" not in schema:
        return []
    required = set(schema.get("required", ()))
    rows = [f"`{name}`:", "", "| field | type | default |", "| --- | --- | --- |"]
    for field, spec in schema["properties"].items():
        default = "required" if field in required else f"`{json.dumps(spec.get('default'))}`"
        rows.append(f"| `{field}` | {type_of(spec, components)} | {default} |")
    return [*rows, ""]


def http_page() -> str:
    from api.routes import document

    doc = document()
    components = doc["components"]["schemas"]
    out = [HTTP_HEAD]
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            out += [f"## `{method.upper()} {path}`", "", op["summary"], ""]
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                names = _refs(body["schema"])
                out += [f"Body: {', '.join(f'`{n}`' for n in names)}", ""]
                for name in names:
                    out += _fields_table(name, components)
            out += [_answers(op["responses"], components), ""]
    return "\n".join(out)


def _answers(responses: dict, components: dict) -> str:
    """`Answers: 200: `Body`; 400, 401: `ErrorResponse`` (the statuses of each body)."""
    by_body: dict[str, list[str]] = {}
    for status, answer in responses.items():
        names = [
            n
            for c in answer.get("content", {}).values()
            for n in _refs(c["schema"])
            or [type_of(c["schema"], components) if c["schema"] else "JSON"]
        ]
        body = ", ".join(f"`{n}`" for n in names) or "no body"
        by_body.setdefault(body, []).append(status)
    return "Answers: " + "; ".join(f"{', '.join(s)}: {body}" for body, s in by_body.items())


def _refs(schema: dict) -> list[str]:
    if "$ref" in schema:
        return [schema["$ref"].rpartition("/")[2]]
    return [name for s in schema.get("oneOf", schema.get("anyOf", [])) for name in _refs(s)]


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    PAGE.write_text(page())
    HTTP_PAGE.write_text(http_page())
    print(f"wrote {PAGE} and {HTTP_PAGE}")
