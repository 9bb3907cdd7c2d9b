"""The packed SpeculationProfiles index (controller.profile_index, issue 27): what a reconciliation reads back
is what the watch delivered, value for value; the index keeps it smaller; a view unpacks each profile once."""

from __future__ import annotations

import json
import math

from specpilot.api import seal
from specpilot.controller.handlers import IndexView
from specpilot.controller.profile_index import Packed, pack
from tests.operator.scenario import measured_status


def _profile(name: str = "h100-eagle3-0123456789") -> dict:
    # as a watch event delivers it: parsed from JSON
    return json.loads(json.dumps({
        "metadata": {"name": name, "namespace": "team", "resourceVersion": "42",
                     "annotations": {seal.NONCE_ANNOTATION: "ab12 cd34", "note": "ünïcode ✓"}},
        "spec": {"sku": "H100-SXM", "concurrencyLevels": [1, 2, 4], "method": {"method": "eagle3"}},
        "status": {**measured_status("H100-SXM", "eagle3", 4), "phase": "Succeeded", "seal": "00ff",
                   # fixed times: two calls made a second apart are the same profile
                   "startedAt": "2026-01-01T00:00:00Z", "completedAt": "2026-01-01T00:05:00Z",
                   "attempts": 0, "reason": None, "odd": [True, False, None, -0.0, 1e-300, 2**70, ""]}}))


def test_unpacking_gives_back_the_value_exactly():
    value = _profile()
    packed = pack(value)
    assert isinstance(packed, Packed)
    back = packed.unpack()
    assert back == value
    assert json.dumps(back) == json.dumps(value)  # key order and every number's representation too
    assert math.copysign(1, back["status"]["odd"][3]) == -1
    # the seal, which covers the whole result, still verifies on what is read back
    assert seal.canonical(back["status"]) == seal.canonical(value["status"])


def test_each_unpack_is_a_fresh_copy():
    packed = pack(_profile())
    first = packed.unpack()
    first["status"]["runs"].clear()
    assert packed.unpack()["status"]["runs"]


def test_a_measured_profile_is_kept_in_a_fraction_of_its_json():
    value = _profile()
    assert len(pack(value)) < len(json.dumps(value)) / 3


def test_a_value_marshal_cannot_write_is_kept_as_it_is():
    value = {"status": {"when": object()}}
    assert pack(value) is value


class _Index(dict):
    """A kopf index: key -> the values of the objects that gave it (one here)."""


def test_a_view_unpacks_each_profile_once_and_follows_a_newer_version():
    index = _Index({"team/a": [pack(_profile("a"))], "team/b": [{"plain": True}], "other/a": [pack(_profile("x"))]})
    view = IndexView(index, prefix="team/")
    first = view["a"]
    assert first == _profile("a")
    assert view["a"] is first  # one copy per view: a reconciliation reads the same object each time
    assert view.get("b") == {"plain": True}  # a value that is not packed is answered as it is
    assert view.get("missing") is None
    assert sorted(view) == ["a", "b"]
    index["team/a"] = [pack({**_profile("a"), "status": {"phase": "Pending"}})]  # the watch brought a new version
    assert view["a"]["status"] == {"phase": "Pending"}
    assert IndexView(index, prefix="team/")["a"] is not view["a"]  # views share nothing
