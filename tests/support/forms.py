"""Read a rendered HTML form the way a browser submits it, so tests post what a person (or an attacker
editing the page) would."""

from html.parser import HTMLParser


class _FormReader(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.fields: dict[str, list[str]] = {}
        self._select = None
        self._option = None
        self._textarea = None

    def _add(self, name, value):
        self.fields.setdefault(name, []).append(value)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        name = attrs.get("name")
        if tag == "input" and name and "disabled" not in attrs:
            kind = attrs.get("type", "text").lower()
            if kind in ("submit", "button", "reset", "file", "image"):
                return
            if kind in ("checkbox", "radio") and "checked" not in attrs:
                return
            self._add(name, attrs.get("value", "on" if kind in ("checkbox", "radio") else ""))
        elif tag == "select" and name and "disabled" not in attrs:
            self._select = name
            self.fields.setdefault(name, [])
        elif tag == "option" and self._select and "selected" in attrs:
            self._option = attrs.get("value")
            if self._option is not None:
                self._add(self._select, self._option)
        elif tag == "textarea" and name and "disabled" not in attrs:
            self._textarea = name
            self._add(name, "")

    def handle_data(self, data):
        if self._textarea:
            self.fields[self._textarea][-1] += data

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        elif tag == "textarea" and self._textarea:
            # Browsers drop the one newline right after <textarea>.
            value = self.fields[self._textarea][-1]
            self.fields[self._textarea][-1] = value[1:] if value.startswith("\n") else value
            self._textarea = None


def form_fields(html: str) -> dict[str, list[str]]:
    """Every field the page would submit (checked boxes, selected options, text), as lists of values
    for Django's test client. Submit buttons are left out: add the one being pressed."""
    reader = _FormReader()
    reader.feed(html)
    return reader.fields
