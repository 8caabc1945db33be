"""Elements of an HTML page with their attributes and text, to assert on what a report shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = frozenset({"br", "hr", "img", "input", "link", "meta", "col", "source", "wbr"})


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def classes(self) -> list[str]:
        return self.attrs.get("class", "").split()


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[Element] = []
        self.open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {name: value or "" for name, value in attrs})
        self.found.append(element)
        if tag not in VOID:
            self.open.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self.open:
            if self.open.pop().tag == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self.open:
            element.parts.append(data)


def elements(html: str) -> list[Element]:
    parser = _Parser()
    parser.feed(html)
    return parser.found


def select(html: str, tag: str, **attrs: str) -> list[Element]:
    """Elements of `tag` whose attributes include `attrs` (`class_` matches one class; `_` in names is `-`)."""
    wanted = {name.rstrip("_").replace("_", "-"): value for name, value in attrs.items()}
    return [
        element
        for element in elements(html)
        if element.tag == tag
        and all(
            value in element.classes if name == "class" else element.attrs.get(name) == value
            for name, value in wanted.items()
        )
    ]
