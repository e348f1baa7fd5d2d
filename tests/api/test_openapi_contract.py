"""The served OpenAPI document is the API's contract: a change to it must be
deliberate. The engine's structs shape the recall answer, so an internal
change could change the API without anyone meaning to; this test makes it
show. After a deliberate change, regenerate the snapshot with
``BRAID_UPDATE_OPENAPI=1 pytest tests/api/test_openapi_contract.py`` and
review its diff."""

from __future__ import annotations

import json
import os
from pathlib import Path

from config import ConfigHolder, load_config
from indexers.runtime import Backends
from service import AppSettings, create_app
from service.auth import Keyring

SNAPSHOT = Path(__file__).with_name("openapi.json")


def served_schema() -> dict[str, object]:
    # No lifespan runs: the document needs no backend.
    settings = AppSettings(
        config=ConfigHolder(load_config()),
        backends=Backends(postgres_dsn="", typesense_nodes=(), typesense_api_key=""),
        keyring=Keyring(),
    )
    document = create_app(settings).openapi_schema.to_schema()
    return json.loads(json.dumps(document, sort_keys=True))  # type: ignore[no-any-return]


def test_the_openapi_document_matches_its_snapshot() -> None:
    schema = served_schema()
    if os.environ.get("BRAID_UPDATE_OPENAPI"):
        SNAPSHOT.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    assert schema == json.loads(SNAPSHOT.read_text()), (
        "the served OpenAPI document changed; if that is meant, regenerate tests/api/openapi.json "
        "(BRAID_UPDATE_OPENAPI=1) and review the diff"
    )
