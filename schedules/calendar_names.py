"""What a calendar's name may be, and how many a schedule may name: shared by the calendars' own checks
(schedules/calendars.py) and a schedule definition's (schedules/definitions.py)."""

from __future__ import annotations

import re

NAME_PATTERN = re.compile(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?")
# The same, anchored, for the API's fields and the OpenAPI document (a pattern there is searched, not matched).
NAME_REGEX = rf"^(?:{NAME_PATTERN.pattern})$"
NAME_RULE = "1-63 characters: lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit"
MAX_CALENDARS_PER_SCHEDULE = 10
