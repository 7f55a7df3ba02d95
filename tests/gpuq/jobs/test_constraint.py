"""Fail closed: a schema is taken only if every keyword it uses can be enforced while sampling."""

import pytest

from gpuq.errors import RequestError
from gpuq.jobs.constraint import enforceable
from gpuq.jobs.generation_params import GenerationParams


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["n"]},
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
        {"$defs": {"c": {"enum": ["red", "blue"]}}, "type": "array", "items": {"$ref": "#/$defs/c"}, "maxItems": 3},
        {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "annotations constrain nothing", "examples": [1]},
    ],
)
def test_schemas_the_engine_enforces_are_taken(schema):
    assert enforceable(schema, "response_format") == schema


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"not": {"type": "string"}}, "not"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "array", "contains": {"type": "integer"}}, "contains"),
        ({"type": "object", "properties": {"a": {"if": {"type": "string"}}}}, "if"),
    ],
)
def test_a_keyword_the_engine_cannot_enforce_is_a_400_naming_it(schema, keyword):
    with pytest.raises(RequestError) as refused:
        enforceable(schema, "format")
    assert refused.value.status == 400 and refused.value.param == "format"
    assert f'["{keyword}"]' in refused.value.message and "cannot be enforced" in refused.value.message
    # The stored request refuses it too (gpuq's jobs API builds requests directly).
    with pytest.raises(ValueError, match=keyword):
        GenerationParams(prompt="x", json_schema=schema)
