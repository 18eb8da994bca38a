"""What a lossy transport delivered, from the roles' messages CSVs."""

from tailcut.training import delivery, records


def write(path, rows):
    with records.CsvLog(path, records.MESSAGE_FIELDS) as log:
        for row in rows:
            log.write({field: row.get(field, 0) for field in records.MESSAGE_FIELDS})


def test_delivered_share_and_repair_rounds_over_every_data_message(tmp_path):
    write(tmp_path / "messages.csv", [
        {"kind": "HELLO", "coordinates": 0},
        {"kind": "PUSH", "coordinates": 1000, "missing": 100, "repairs": 1},
        {"kind": "PUSH", "coordinates": 1000, "missing": 0, "repairs": 0}])
    write(tmp_path / "messages-worker-0.csv", [
        {"kind": "PARAMS", "coordinates": 1000, "missing": 0, "repairs": 3}])
    summary = delivery.summarize(tmp_path)
    assert summary["messages"] == 3 and summary["coordinates"] == 3000
    assert summary["delivered"] == round(1 - 100 / 3000, 5)
    assert summary["incomplete_share"] == round(1 / 3, 4)
    assert summary["repairs"]["max"] == 3 and summary["repairs"]["median"] == 1
    line = delivery.describe(summary, "bounded-loss")
    assert line.startswith("bounded-loss: 96.67% of coordinates delivered over 3 data "
                           "messages (33.3% of them incomplete)")


def test_a_run_without_data_messages_says_so(tmp_path):
    assert delivery.describe(delivery.summarize(tmp_path), "udp") == \
        "udp: no data message was recorded"
