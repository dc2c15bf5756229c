"""JSON schemas for the structured-output tests (engine, CLI, server): nested objects, enums,
arrays with bounds, patterns, anyOf, $defs, nullable, formats of numbers. Each with a prompt
that asks for it; strings and arrays are bounded so a small model completes them."""

from __future__ import annotations

NAME = {"type": "string", "maxLength": 20}

SCHEMAS: dict[str, tuple[str, dict]] = {
    "person": ("Describe a person as JSON.", {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False}),
    "enum": ("What colour is the sky? Answer in JSON.", {
        "type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
        "required": ["colour"], "additionalProperties": False}),
    "const": ("Say hello in JSON.", {
        "type": "object", "properties": {"greeting": {"const": "hello"}, "to": NAME},
        "required": ["greeting", "to"], "additionalProperties": False}),
    "bounded_array": ("List three fruits as JSON.", {
        "type": "object",
        "properties": {"fruits": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 4}},
        "required": ["fruits"], "additionalProperties": False}),
    "top_level_array": ("Give some small numbers as a JSON array.", {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 1, "maxItems": 5}),
    "nested": ("Describe a book and its author as JSON.", {
        "type": "object",
        "properties": {
            "title": NAME,
            "author": {"type": "object",
                       "properties": {"name": NAME, "born": {"type": "integer",
                                                             "minimum": 1000, "maximum": 2024}},
                       "required": ["name", "born"], "additionalProperties": False}},
        "required": ["title", "author"], "additionalProperties": False}),
    "pattern": ("Give a date as JSON.", {
        "type": "object",
        "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
        "required": ["date"], "additionalProperties": False}),
    "pattern_code": ("Give a product code as JSON.", {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
        "required": ["code"], "additionalProperties": False}),
    "any_of": ("Give an id as JSON.", {
        "type": "object",
        "properties": {"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 1000},
                                        {"type": "string", "maxLength": 8}]}},
        "required": ["id"], "additionalProperties": False}),
    "defs": ("Describe two points as JSON.", {
        "$defs": {"point": {"type": "object",
                            "properties": {"x": {"type": "integer", "minimum": -99,
                                                 "maximum": 99},
                                           "y": {"type": "integer", "minimum": -99,
                                                 "maximum": 99}},
                            "required": ["x", "y"], "additionalProperties": False}},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"], "additionalProperties": False}),
    "nullable": ("Describe a user with an optional nickname as JSON.", {
        "type": "object",
        "properties": {"name": NAME, "nickname": {"type": ["string", "null"], "maxLength": 10}},
        "required": ["name", "nickname"], "additionalProperties": False}),
    "nullable_any_of": ("Give a score, or null if unknown, as JSON.", {
        "type": "object",
        "properties": {"score": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 10},
                                           {"type": "null"}]}},
        "required": ["score"], "additionalProperties": False}),
    "boolean": ("Is water wet? Answer as JSON.", {
        "type": "object", "properties": {"answer": {"type": "boolean"}, "reason": NAME},
        "required": ["answer", "reason"], "additionalProperties": False}),
    "number_bounds": ("Give a temperature in Celsius as JSON.", {
        "type": "object",
        "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 50}},
        "required": ["celsius"], "additionalProperties": False}),
    "array_of_objects": ("List two cities and their countries as JSON.", {
        "type": "object",
        "properties": {"cities": {"type": "array", "minItems": 1, "maxItems": 3,
                                  "items": {"type": "object",
                                            "properties": {"city": NAME, "country": NAME},
                                            "required": ["city", "country"],
                                            "additionalProperties": False}}},
        "required": ["cities"], "additionalProperties": False}),
    "unique_enum_list": ("Pick some weekdays as JSON.", {
        "type": "object",
        "properties": {"days": {"type": "array", "maxItems": 3,
                                "items": {"enum": ["mon", "tue", "wed", "thu", "fri"]}}},
        "required": ["days"], "additionalProperties": False}),
    "string_bounds": ("Give a short word as JSON.", {
        "type": "object",
        "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 6}},
        "required": ["word"], "additionalProperties": False}),
    "deep": ("Describe a company, its office and its address as JSON.", {
        "type": "object",
        "properties": {"company": {"type": "object", "properties": {
            "office": {"type": "object", "properties": {
                "address": {"type": "object", "properties": {"city": NAME, "zip": {
                    "type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False}},
                "required": ["address"], "additionalProperties": False}},
            "required": ["office"], "additionalProperties": False}},
        "required": ["company"], "additionalProperties": False}),
    "one_of_shapes": ("Describe a shape as JSON.", {
        "anyOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"},
                                              "radius": {"type": "integer", "minimum": 1,
                                                         "maximum": 9}},
             "required": ["kind", "radius"], "additionalProperties": False},
            {"type": "object", "properties": {"kind": {"const": "square"},
                                              "side": {"type": "integer", "minimum": 1,
                                                       "maximum": 9}},
             "required": ["kind", "side"], "additionalProperties": False}]}),
    "optional_fields": ("Describe a pet as JSON.", {
        "type": "object",
        "properties": {"name": NAME, "species": {"enum": ["cat", "dog", "fish"]},
                       "age": {"type": "integer", "minimum": 0, "maximum": 30}},
        "required": ["species"], "additionalProperties": False}),
    "integer_enum": ("Rate this from 1 to 5 as JSON.", {
        "type": "object", "properties": {"rating": {"enum": [1, 2, 3, 4, 5]}},
        "required": ["rating"], "additionalProperties": False}),
    "tuple_like": ("Give a name and an age as a JSON array.", {
        "type": "array", "prefixItems": [NAME, {"type": "integer", "minimum": 0, "maximum": 99}],
        "items": False, "minItems": 2}),
    "defs_items": ("Describe a small team and its members as JSON.", {
        "$defs": {"member": {"type": "object",
                             "properties": {"name": {"type": "string", "maxLength": 10},
                                            "role": {"enum": ["lead", "dev", "qa"]}},
                             "required": ["name", "role"], "additionalProperties": False}},
        "type": "object",
        "properties": {"team": NAME, "members": {"type": "array", "minItems": 1, "maxItems": 3,
                                                 "items": {"$ref": "#/$defs/member"}}},
        "required": ["team", "members"], "additionalProperties": False}),
}
