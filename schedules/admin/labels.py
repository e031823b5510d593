"""Labels in the console: typed as `key=value` lines, shown as chips, and picked with a selector on the list.

The rules are core/labels.py's, as the API applies them: the form field only turns lines into a dict, and
clean_definition (label_problems) judges it; the list filter parses the selector with parse_selector and filters
with Schedule.objects.selected, the queryset the API's ?selector= uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from core.labels import SELECTOR_RULE, Selector, SelectorInvalid, parse_selector

# Chips shown per row of the list; the rest are counted (every label is on the schedule's page).
LIST_CHIPS = 4
# Set on the request once the selector's refusal was reported: the changelist builds its filters more than once
# per request (a bulk action reads the queryset again), and one message is enough.
_REPORTED = "_schedule_selector_reported"


def labels_text(labels: dict[str, str]) -> str:
    """The label set as the form shows it: one `key=value` per line, keys in order."""
    return "\n".join(f"{key}={value}" for key, value in sorted(labels.items()))


class LabelsField(forms.CharField):
    """Labels as `key=value` lines, friendlier to type than a JSON object.

    Only the shape is checked here (each non-blank line has an '=', no key twice); what a key or value may be is
    label_problems', through clean_definition, so the console and the API refuse the same sets in the same words.
    A value may hold '=' (the line splits at the first); lines are split on newlines only, so any other control
    character stays in the value and is refused by the rules rather than silently splitting it.
    """

    widget = forms.Textarea(attrs={"rows": 4, "cols": 40, "placeholder": "team=payments\nenv=prod"})

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault(
            "help_text",
            "One key=value per line, e.g. team=payments; at most 20. Lists and fleet calls pick schedules by them "
            "(a selector such as team=payments,env!=dev). Empty: no labels.",
        )
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        return labels_text(value) if isinstance(value, dict) else value

    def to_python(self, value: Any) -> dict[str, str]:  # type: ignore[override]
        if isinstance(value, dict):
            return value
        text = super().to_python(value) or ""
        labels: dict[str, str] = {}
        problems: list[str] = []
        for number, line in enumerate(text.split("\n"), start=1):
            line = line.strip()
            if not line:
                continue
            key, separator, label = line.partition("=")
            key, label = key.strip(), label.strip()
            if not separator:
                problems.append(f"Line {number} ({line[:40]!r}) is not key=value.")
            elif key in labels:
                problems.append(f"Label {key[:40]!r} is given twice.")
            else:
                labels[key] = label
        if problems:
            raise forms.ValidationError(problems, code="invalid")
        return labels

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return self.to_python(data) != (initial or {})
        except forms.ValidationError:
            return True


def label_chips(labels: dict[str, str] | None, *, limit: int | None = None) -> SafeString | str:
    """`team=payments` chips, each a link to the list of schedules carrying that label (when a selector can say
    it: a value with ',' or '=' cannot be selected), the rest counted beyond `limit`."""
    if not labels:
        return "—"
    pairs = sorted(labels.items())
    shown = pairs if limit is None else pairs[:limit]
    changelist = reverse("admin:schedules_schedule_changelist")
    chips = format_html_join(" ", "{}", ((_chip(changelist, key, value),) for key, value in shown))
    more = len(pairs) - len(shown)
    if more:
        hidden = ", ".join(f"{key}={value}" for key, value in pairs[len(shown) :])
        chips = format_html('{} <span class="label-more" title="{}">+{} more</span>', chips, hidden, more)
    return format_html('<span class="label-chips">{}</span>', chips)


def _chip(changelist: str, key: str, value: str) -> SafeString:
    text = f"{key}={value}"
    if _selectable(key, value):
        url = f"{changelist}?{urlencode({SelectorFilter.parameter_name: text})}"
        title = f"{text}: the schedules labelled so"
        return format_html('<a class="label-chip" href="{}" title="{}">{}</a>', url, title, text)
    return format_html('<span class="label-chip" title="{}">{}</span>', text, text)


def _selectable(key: str, value: str) -> bool:
    try:
        return parse_selector(f"{key}={value}").equal == ((key, value),)
    except SelectorInvalid:
        return False


class SelectorFilter(admin.ListFilter):
    """A label selector typed into the list's sidebar (`team=payments,env!=dev`), the API's ?selector= grammar.

    A malformed selector lists nothing and says why, at the top of the page and under the box: an unfiltered list
    would read as its result, and a "select all" bulk action on it would reach every schedule.
    """

    title = "label selector"
    parameter_name = "selector"
    template = "admin/schedules/schedule/selector_filter.html"

    def __init__(self, request: HttpRequest, params: dict, model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        self.text = ""
        self.selector = Selector()
        self.error = ""
        if self.parameter_name not in params:
            return
        self.text = params.pop(self.parameter_name)[-1]
        self.used_parameters[self.parameter_name] = self.text
        try:
            self.selector = parse_selector(self.text)
        except SelectorInvalid as exc:
            self.error = str(exc)
            if not getattr(request, _REPORTED, False):
                setattr(request, _REPORTED, True)
                messages.error(request, f"Label selector not applied, no schedule listed: {self.error}")

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return [self.parameter_name]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.error:
            return queryset.none()
        if self.selector.empty:
            return queryset
        return queryset.selected(self.selector)  # type: ignore[attr-defined]

    def choices(self, changelist: Any) -> Iterator[Any]:
        yield {
            "text": self.text,
            "error": self.error,
            "rule": SELECTOR_RULE,
            # The list's other filters, search and ordering ride along with the form.
            "hidden": [(key, value) for key, value in changelist.params.items() if key != self.parameter_name],
            "clear": changelist.get_query_string(remove=[self.parameter_name]) if self.text else "",
        }
