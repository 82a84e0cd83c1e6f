"""Fixtures of the store tests."""

from __future__ import annotations

import pytest

from radixlink.stores import pagefiles


@pytest.fixture(params=["compiled", "python"])
def page_loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The directory store's page reads: through its compiled loop
    (``pagefiles.read_pages_xxh3``), or in Python alone (``COMPILED`` None, as where the
    optional extension was not built)."""
    if request.param == "python":
        monkeypatch.setattr(pagefiles, "COMPILED", None)
    elif pagefiles.COMPILED is None:
        pytest.skip("the compiled page loop is not built here (no C compiler at install)")
    return str(request.param)
