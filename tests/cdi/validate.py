#!/usr/bin/env python3
"""Validates a CDI spec (JSON) against the CDI project's schema (schema.json and defs.json
beside this file, from github.com/cncf-tags/container-device-interface, schema/, commit
05ae4b5bb730a036cb3f79477bd6676eea4a8c83, Apache License 2.0). Exit 0 when valid, 1 with
the reason when not. Used by tests/cdi.rs."""

import json
import os
import sys

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))

with open(os.path.join(HERE, "schema.json")) as f:
    schema = json.load(f)
with open(os.path.join(HERE, "defs.json")) as f:
    defs = json.load(f)

# the schema refers to "defs.json#/definitions/X": the same definitions, inlined
text = json.dumps(schema).replace('"defs.json#/definitions/', '"#/definitions/')
schema = json.loads(text)
schema["definitions"] = defs["definitions"]

with open(sys.argv[1]) as f:
    doc = json.load(f)
try:
    jsonschema.Draft7Validator(schema).validate(doc)
except jsonschema.ValidationError as e:
    print(f"{sys.argv[1]}: invalid CDI spec: {e.message} at {list(e.absolute_path)}")
    sys.exit(1)
print(f"{sys.argv[1]}: valid")
