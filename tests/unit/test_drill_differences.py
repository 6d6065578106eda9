"""The DLedger drill names where members differ (an 'identical: False' must be diagnosable)."""

from hasvc.tools.drill_dledger import describe_differences


def test_names_the_first_differing_entry_and_the_differing_queue_files():
    reference = [(1, 1, 48, b"a"), (2, 1, 97, b"b")]
    logs = {"n0": reference, "n1": [(1, 1, 48, b"a"), (2, 2, 97, b"c")], "n2": reference[:1]}
    queues = {"n0": {"T/0/0": "x"}, "n1": {"T/0/0": "x"}, "n2": {"T/0/0": "y", "T/1/0": "z"}}
    text = describe_differences(logs, queues, "n0")
    assert "n1 entry #1 (index 2) differs; 2 entries vs 2" in text
    assert "n2: 1 entries vs 2" in text
    assert "n2 consume queue files T/0/0, T/1/0" in text
    assert "n1 consume" not in text


def test_equal_members_give_no_difference():
    log = [(1, 1, 48, b"a")]
    assert describe_differences({"n0": log, "n1": list(log)}, {"n0": {}, "n1": {}}, "n0") == "nothing found on a second look"
