"""The data migration turns the old free-text stop reasons into the StopReason words, keeping an
operator's own words as the note, so old instances still read the same sentence."""

import importlib

import pytest

from portal.instances.models import Instance
from portal.instances.selectors import stop_reason_text
from portal.instances.stop_reasons import StopReason

migration = importlib.import_module("portal.instances.migrations.0004_stop_note_and_reason_words")


@pytest.mark.parametrize(
    ("old", "reason", "note", "sentence"),
    [
        ("user", StopReason.USER, "", "You stopped it."),
        ("credits exhausted", StopReason.CREDITS_EXHAUSTED, "", "DevCloud stopped it because your credits ran out."),
        ("idle", StopReason.IDLE, "", "It was stopped because it was idle."),
        ("max_length", StopReason.MAX_LENGTH, "", "It reached the longest a session may run"),
        ("operator", StopReason.OPERATOR, "", "An operator stopped it."),
        ("operator: account suspended", StopReason.SUSPENDED, "", "your account was suspended"),
        ("operator: host evicted", StopReason.HOST_EVICTED, "", "An operator took its GPU host out of service"),
        ("operator: Disk check", StopReason.OPERATOR, "Disk check", "An operator stopped it: Disk check"),
    ],
)
def test_each_old_string_becomes_a_word_and_reads_as_before(old, reason, note, sentence):
    assert migration.words_for(old) == (reason, note)
    assert sentence in stop_reason_text(Instance(stop_reason=reason, stop_note=note))
