"""The ``chatkeep`` command end to end on Azurite, through the kit."""

from __future__ import annotations

import pytest

from chatkeep.testing import CLIConformance
from chatkeep.testing.faults import free_port


class TestBlobCommandLine(CLIConformance):
    multi_process = True  # the account is in AZURE_STORAGE_CONNECTION_STRING, which child processes inherit

    @pytest.fixture
    def store_url(self, blob_url: str) -> str:
        return blob_url

    @pytest.fixture
    def unreachable_url(self, container: str, monkeypatch: pytest.MonkeyPatch) -> str:
        # An account endpoint where nothing listens. It is named in the URL (with a SAS token from the
        # environment), so store_url keeps reaching Azurite through the connection string.
        monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "sv=2022-11-02&sig=unused")
        return f"azblob://{container}?account_url=http://127.0.0.1:{free_port()}/devstoreaccount1&retries=0"
