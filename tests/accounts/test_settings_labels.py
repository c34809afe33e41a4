"""The Settings page's forms can be used with a screen reader or by clicking a label: every id on the
page is unique, every label names a field that exists, and a group of choices is named by a legend."""

from html.parser import HTMLParser

import pytest

pytestmark = pytest.mark.django_db


class Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.label_targets, self.legends, self._in_legend = [], [], [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
        if tag == "label":
            self.label_targets.append(attrs.get("for"))
        self._in_legend = tag == "legend"

    def handle_data(self, data):
        if self._in_legend and data.strip():
            self.legends.append(data.strip())
            self._in_legend = False


def test_every_label_on_the_settings_page_names_its_own_field(alice_client):
    page = Ids()
    page.feed(alice_client.get("/accounts/settings/").content.decode())

    duplicates = sorted({id_ for id_ in page.ids if page.ids.count(id_) > 1})
    assert duplicates == []
    assert [target for target in page.label_targets if target not in page.ids] == []
    assert "Scope" in page.legends
