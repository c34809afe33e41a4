"""A pull's progress, as the image job shows it, from the engine's per-layer messages."""

from provisioning.drivers.docker_engine import PullProgress


def feed(progress, *chunks):
    return [percent for chunk in chunks if (percent := progress.update(chunk)) is not None]


def test_it_moves_forward_from_downloads_to_extraction_and_stops_short_of_100_until_the_job_ends():
    progress = PullProgress()

    seen = feed(
        progress,
        {"status": "Pulling from devcloud/cpu", "id": "abc123"},
        {"status": "Pulling fs layer", "id": "l1"},
        {"status": "Pulling fs layer", "id": "l2"},
        {"status": "Downloading", "id": "l1", "progressDetail": {"current": 50, "total": 100}},
        {"status": "Download complete", "id": "l1"},
        {"status": "Downloading", "id": "l2", "progressDetail": {"current": 10, "total": 10}},
        {"status": "Extracting", "id": "l1", "progressDetail": {"current": 100, "total": 100}},
        {"status": "Pull complete", "id": "l1"},
        {"status": "Pull complete", "id": "l2"},
    )

    assert seen == [12, 25, 50, 75, 99]


def test_a_late_smaller_report_never_takes_it_back():
    progress = PullProgress()
    feed(progress, {"status": "Downloading", "id": "l1", "progressDetail": {"current": 80, "total": 100}})

    late = {"status": "Downloading", "id": "l1", "progressDetail": {"current": 10, "total": 100}}
    assert progress.update(late) is None
    assert progress.percent == 40
